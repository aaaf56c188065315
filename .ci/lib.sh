# Helpers for CI's legs, sourced by .ci/run and by every .ci/leg-* script (see .ci/run's header).
# Each function runs from the repository root and fails the leg (set -e) when something is wrong.
# shellcheck shell=bash

# The interpreter for a Python minor version ("3.13"), installed by pyenv under
# $(pyenv root)/versions/<version>; the newest patch release found wins.
ci_python() {
  local minor=$1 root found
  root=$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")
  found=$(find "$root/versions" -mindepth 1 -maxdepth 1 -regex ".*/${minor//./\\.}\\.[0-9]+" \
    -printf '%f\n' 2>/dev/null | sort -V | tail -n 1)
  if [[ -z $found || ! -x $root/versions/$found/bin/python ]]; then
    echo "CI needs Python $minor, looked for $root/versions/$minor.*/bin/python:" \
      "install it with 'pyenv install $minor'." >&2
    return 1
  fi
  echo "$root/versions/$found/bin/python"
}

# A fresh, activated virtual environment of Python MINOR named NAME, with a current pip.
ci_bare_venv() {
  local minor=$1 name=$2 python venv
  python=$(ci_python "$minor")
  venv="$CI_TMP/venvs/${name//[^A-Za-z0-9.-]/_}"
  "$python" -m venv "$venv"
  # shellcheck disable=SC1091
  source "$venv/bin/activate"
  python -m pip install --quiet --upgrade pip
}

# This leg's own fresh virtual environment, activated, with the project (editable) and its
# EXTRAS ("test,lint") installed for DJANGO ("django==6.1.*"): ci_venv MINOR DJANGO EXTRAS
ci_venv() {
  local start=$SECONDS
  ci_bare_venv "$1" "$CI_LEG"
  # An editable install writes the package's metadata into the checkout: one leg at a time, for
  # legs that run side by side (.ci/run's leg_aside).
  flock "$CI_TMP/editable.lock" python -m pip install --quiet -e ".[$3]" "$2"
  echo "$(python --version), Django $(python -m django --version), in $VIRTUAL_ENV"
  printf '%s\t%s\t%s\n' "$CI_LEG" "venv ($(python --version), Django $(python -m django --version))" \
    "ready in $((SECONDS - start)) s" >>"$CI_RESULTS"
}

# This run's own database name for this leg: several suites may share one server.
ci_test_db() {
  local name="${CI_RUN_ID}_${CI_LEG}"
  echo "${name//[^A-Za-z0-9]/_}" | tr '[:upper:]' '[:lower:]'
}

# Run pytest (with any VAR=value set by the caller) and record its closing counts under LABEL
# for the summary table: ci_pytest LABEL [pytest arguments...]
ci_pytest() {
  local label=$1 log status=0
  shift
  log=$(mktemp "$CI_TMP/pytest-XXXXXX.log") # legs side by side: never one name twice
  echo "-- $label"
  python -m pytest "$@" 2>&1 | tee "$log" || status=$?
  printf '%s\t%s\t%s\n' "$CI_LEG" "$label" \
    "$(tail -n 1 "$log" | sed -E 's/^=+ //; s/ =+$//; s/ \([0-9:]+\)$//')" >>"$CI_RESULTS"
  if ((status != 0)); then
    echo "$label: pytest failed (exit $status)" >&2
    return "$status"
  fi
  CI_LAST_LOG=$log
}

# As ci_pytest, but a skipped test fails the leg: a server-backed suite must run every test.
# The one skip allowed is the django.tasks tests on Django 5.2, which has no django.tasks.
ci_pytest_no_skips() {
  ci_pytest "$@" || return $? # a failed suite fails the leg, whatever the caller's `set -e`
  local skipped
  skipped=$(grep -E '^SKIPPED' "$CI_LAST_LOG" || true)
  if python -c 'import django, sys; sys.exit(django.VERSION >= (6,))'; then
    skipped=$(grep -v 'needs Django 6.0+ (django.tasks)' <<<"$skipped" || true)
  fi
  if [[ -n $skipped ]]; then
    echo "$1: tests were skipped, which fails CI here:" >&2
    echo "$skipped" >&2
    return 1
  fi
}

# Lanes: a leg whose suites wait more than they compute (servers stopped, workers killed,
# faults held for seconds) runs them side by side. ci_lane NAME COMMAND [ARGUMENTS...] starts one
# in the background (a function of the leg's too), its output kept apart; ci_lanes_wait waits
# for every lane, prints each one's output whole, in order, and fails if any failed.
CI_LANES=()
ci_lane() {
  local name=$1
  shift
  ("$@") >"$CI_TMP/lane-$CI_LEG-$name.log" 2>&1 &
  CI_LANES+=("$name:$!")
}
ci_lanes_wait() {
  local status=0 entry
  for entry in "${CI_LANES[@]}"; do
    wait "${entry#*:}" || status=1
  done
  for entry in "${CI_LANES[@]}"; do
    echo "== lane ${entry%%:*}"
    cat "$CI_TMP/lane-$CI_LEG-${entry%%:*}.log"
  done
  CI_LANES=()
  return "$status"
}

# The suite on PostgreSQL ($CI_PG_URL), in this leg's own test database, no skips allowed:
# ci_pytest_postgresql LABEL [pytest arguments...]
ci_pytest_postgresql() {
  DATABASE_URL="$CI_PG_URL" IDEMPOTENCY_TEST_DB="$(ci_test_db)" ci_pytest_no_skips "$@"
}

# Fail early and clearly when the PostgreSQL server is not there (run inside a venv with psycopg).
ci_require_postgresql() {
  python - "$CI_PG_URL" <<'PY'
import sys
import psycopg
url = sys.argv[1].replace("postgres://", "postgresql://", 1)
try:
    with psycopg.connect(url, connect_timeout=10) as conn:
        print("PostgreSQL", conn.execute("SHOW server_version").fetchone()[0])
except Exception as exc:
    sys.exit(f"CI needs PostgreSQL at {sys.argv[1]} (CI_DATABASE_URL): {exc}")
PY
}

# Install the Debian packages named that are missing (as root, after apt-get update); elsewhere
# say which are missing and go on: the legs that need them fail clearly.
ci_apt_packages() {
  local missing=() package
  for package in "$@"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "ok installed" ||
      missing+=("$package")
  done
  ((${#missing[@]})) || return 0
  if [[ $(id -u) != 0 ]]; then
    echo "Debian packages missing (install them as root): ${missing[*]}" >&2
    return 0
  fi
  echo "-- apt-get install ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# The admin's browser test needs Chromium; without it the test would skip, which fails CI.
ci_require_chromium() {
  command -v chromium >/dev/null || command -v chromium-browser >/dev/null || {
    echo "CI needs Chromium for tests/test_admin_browser.py (apt-get install chromium)" >&2
    return 1
  }
}

# The main leg's virtual environment, activated, when it is there (the service legs reuse it);
# otherwise this leg's own, as the main leg builds it.
ci_main_venv() {
  local venv="$CI_TMP/venvs/main"
  if [[ -x $venv/bin/python ]]; then
    # shellcheck disable=SC1091
    source "$venv/bin/activate"
    echo "$(python --version), Django $(python -m django --version), in $VIRTUAL_ENV (the main leg's)"
  else
    ci_venv 3.11 "django==5.2.*" test,mysql
  fi
  export CI_VENV=$VIRTUAL_ENV
}

# Defaults, so that a leg script runs alone too (bash .ci/leg-release): .ci/run sets the same.
: "${CI_PG_URL:=${CI_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/test}}"
: "${CI_RUN_ID:=test_idem_ci_$$_$(date +%s)}"
: "${CI_LEG:=$(basename "$0")}"
if [[ -z ${CI_TMP:-} ]]; then
  CI_TMP=$(mktemp -d)
  trap 'rm -rf "$CI_TMP"' EXIT
fi
: "${CI_RESULTS:=$CI_TMP/results.tsv}"
export CI_PG_URL CI_RUN_ID CI_LEG CI_TMP CI_RESULTS
