# Helpers shared by the command-line tests (sourced): a temporary folder $TMP removed at exit,
# pass/fail counting, `run` (memsim from $TMP, output captured) and the expect_* checks.
# Needs MEMSIM (an absolute path); sets TMP, failures, checks, rc.

TMP=$(mktemp -d "${TMPDIR:-/tmp}/memsim_${CLI_TEST_NAME:-test}.XXXXXX") || { echo "FAIL: mktemp -d" >&2; exit 1; }
trap 'rm -rf "$TMP"' EXIT

failures=0
checks=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
pass() { checks=$((checks + 1)); }
# check DESCRIPTION COMMAND...: runs a test command, counting it as pass or fail.
check() {
  local what=$1
  shift
  if "$@"; then pass; else fail "$what"; fi
}
show() {  # prints a captured file (indented) to help explain a failure
  sed 's/^/    | /' "$1" >&2
}

# run NAME ARGS...: runs memsim from $TMP with ARGS; stdout/stderr go to $TMP/NAME.out/.err and
# the exit status to $rc.
run() {
  local name=$1
  shift
  (cd "$TMP" && "$MEMSIM" "$@") >"$TMP/$name.out" 2>"$TMP/$name.err"
  rc=$?
}

# expect_rc NAME WANT: the last run's exit status is WANT.
expect_rc() {
  if [ "$rc" -eq "$2" ]; then
    pass
  else
    fail "$1: exit code $rc, expected $2"
    echo "  stdout:" >&2; show "$TMP/$1.out"
    echo "  stderr:" >&2; show "$TMP/$1.err"
  fi
}

# expect_in FILE TEXT WHAT: FILE holds TEXT (fixed string).
expect_in() {
  if grep -qF -- "$2" "$1"; then
    pass
  else
    fail "$3: '$2' not found in $(basename "$1")"
    show "$1"
  fi
}

# expect_re FILE REGEX WHAT: FILE has a line matching the extended regex REGEX.
expect_re() {
  if grep -qE -- "$2" "$1"; then
    pass
  else
    fail "$3: /$2/ not found in $(basename "$1")"
    show "$1"
  fi
}

# expect_one_line FILE WHAT: FILE has exactly one line (one error, not a cascade).
expect_one_line() {
  local n
  n=$(wc -l <"$1")
  if [ "$n" -eq 1 ]; then pass; else fail "$2: $n lines in $(basename "$1"), expected 1"; show "$1"; fi
}

expect_absent() {
  if [ -e "$1" ]; then fail "$2: $1 exists but should not"; else pass; fi
}

