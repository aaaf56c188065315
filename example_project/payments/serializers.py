from __future__ import annotations

from rest_framework import serializers

from example_project.payments.models import Charge, Refund

MAX_AMOUNT = 99_999_999


class ChargeSerializer(serializers.ModelSerializer):
    amount = serializers.IntegerField(min_value=1, max_value=MAX_AMOUNT)

    class Meta:
        model = Charge
        fields = ["id", "amount", "currency", "description", "provider_id", "created"]
        read_only_fields = ["id", "provider_id", "created"]


class RefundSerializer(serializers.ModelSerializer):
    amount = serializers.IntegerField(min_value=1, max_value=MAX_AMOUNT)

    class Meta:
        model = Refund
        fields = ["id", "charge", "amount", "status", "provider_id", "created"]
        read_only_fields = ["id", "charge", "status", "provider_id", "created"]

    def validate_amount(self, value: int) -> int:
        charge: Charge = self.context["charge"]
        # Pending refunds count too: one may be on its way through the provider.
        refunded = sum(refund.amount for refund in charge.refunds.all())
        if value > charge.amount - refunded:
            raise serializers.ValidationError(
                f"At most {charge.amount - refunded} of this charge is left to refund."
            )
        return value


class ReceiptSerializer(serializers.Serializer):
    email = serializers.EmailField()
