#!/usr/bin/env bash
# The whole test suite. CI runs it from .ci/run after installing what it
# needs; on a machine without qemu, diod or shellcheck the tests that need
# them skip with a message, unless CI=true, where a missing tool fails.
set -euo pipefail
cd "$(dirname "$0")"

unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then
	echo "gofmt would change: $unformatted" >&2
	exit 1
fi
go vet ./...
go test -race -timeout 45m ./...

for mod in interop bench; do
	if [ -f "$mod/go.mod" ]; then
		(cd "$mod" && go vet ./... && go test -race -timeout 45m ./...)
	fi
done

if command -v shellcheck >/dev/null; then
	shellcheck -x examples/shell/*.sh
elif [ "${CI:-}" = true ]; then
	echo "shellcheck is missing" >&2
	exit 1
else
	echo "shellcheck not installed: examples/shell not linted" >&2
fi
