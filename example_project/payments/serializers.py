"""The example API's serializers, held to what its OpenAPI schema says (issue 32).

DRF coerces where the schema promises a type: a ``CharField`` takes the JSON number ``42`` as
``"42"``, an ``IntegerField`` the string ``"42"``, and a form field sent twice counts as its last
value. :class:`SchemaTypes` refuses those; the schema fuzzing leg (``.ci/leg-schemathesis``) holds
the two together. Read-only fields and fields the API does not know are ignored in a request,
as the schema's description says (a client may add its own, such as ``sent_at``).
"""

from __future__ import annotations

from typing import Any

from django.http import QueryDict
from rest_framework import serializers

from example_project.payments.models import Charge, Refund

MAX_AMOUNT = 99_999_999


class SchemaTypes(serializers.Serializer):
    """Refuse what the schema does not allow and DRF would coerce: in a JSON body, a string
    field must be a JSON string and an integer a JSON integer; in a form body (all text), a
    field must be given once."""

    def to_internal_value(self, data: Any) -> Any:
        errors: dict[str, list[str]] = {}
        for name, field in self.fields.items():
            if field.read_only or name not in data:
                continue
            if isinstance(data, QueryDict):
                if len(data.getlist(name)) > 1:
                    errors[name] = ["Give this field once."]
            elif not _json_type_matches(field, data[name]):
                errors[name] = [f"Must be a JSON {_json_type(field)}."]
        if errors:
            raise serializers.ValidationError(errors)
        return super().to_internal_value(data)


def _json_type(field: serializers.Field) -> str:
    return "integer" if isinstance(field, serializers.IntegerField) else "string"


def _json_type_matches(field: serializers.Field, value: Any) -> bool:
    if value is None:
        return True  # the field's own allow_null decides
    if isinstance(field, serializers.IntegerField):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(field, (serializers.CharField, serializers.ChoiceField)):
        return isinstance(value, str)
    return True


class ChargeSerializer(SchemaTypes, serializers.ModelSerializer):
    amount = serializers.IntegerField(min_value=1, max_value=MAX_AMOUNT)

    class Meta:
        model = Charge
        fields = ["id", "amount", "currency", "description", "provider_id", "created"]
        read_only_fields = ["id", "provider_id", "created"]


class RefundSerializer(SchemaTypes, serializers.ModelSerializer):
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


class ReceiptSerializer(SchemaTypes):
    email = serializers.EmailField()
