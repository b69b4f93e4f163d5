#!/usr/bin/env bash
# test-services.sh starts one private PostgreSQL and one private Redis on free
# loopback ports, exports PROTEAN_TEST_DATABASE_URL and PROTEAN_TEST_REDIS_URL
# for internal/testserver, runs the command given as arguments, and stops
# both servers (by their own pids) when it exits, whatever the exit status.
#
#   scripts/test-services.sh go test -race ./...
#
# A variable that is already set is kept, and that server is not started.
# Missing server binaries are installed with apt-get when running as root;
# otherwise the script says what to install. The servers trade durability
# for speed (fsync off, no Redis persistence): scripts/services.sh starts
# the durable ones production mode needs.
set -euo pipefail

if [ "$#" -eq 0 ]; then
	echo "usage: $0 COMMAND [ARGS...]" >&2
	exit 2
fi

# shellcheck source=lib/services.sh
. "$(dirname "$0")/lib/services.sh"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/protean-services-XXXXXX")
PG_PID=""
REDIS_PID=""

cleanup() {
	local status=$?
	pg_stop "$PG_PID"
	redis_stop "$REDIS_PID"
	rm -rf "$tmp"
	exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if [ -z "${PROTEAN_TEST_DATABASE_URL:-}" ]; then
	pg_port=$(free_port)
	PG_INITDB_FLAGS=--no-sync pg_start "$tmp" "$pg_port" \
		-c fsync=off -c synchronous_commit=off -c full_page_writes=off \
		-c max_connections=300 -c shared_buffers=128MB || exit 1
	export PROTEAN_TEST_DATABASE_URL="postgres://postgres@127.0.0.1:$pg_port/postgres?sslmode=disable"
fi

if [ -z "${PROTEAN_TEST_REDIS_URL:-}" ]; then
	redis_port=$(free_port)
	redis_start "$tmp" "$redis_port" --save '' --appendonly no || exit 1
	export PROTEAN_TEST_REDIS_URL="redis://127.0.0.1:$redis_port/0"
fi

# The C example modules' toolchain (the second guest language): their
# tests build them and never skip.
"$(dirname "$0")/wasm-c.sh" ensure

echo "test services: PostgreSQL ${PROTEAN_TEST_DATABASE_URL}, Redis ${PROTEAN_TEST_REDIS_URL}" >&2
set +e
"$@"
status=$?
set -e
exit "$status"
