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
# otherwise the script says what to install.
set -euo pipefail

if [ "$#" -eq 0 ]; then
	echo "usage: $0 COMMAND [ARGS...]" >&2
	exit 2
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/protean-services-XXXXXX")
pg_pid=""
redis_pid=""

cleanup() {
	local status=$?
	if [ -n "$pg_pid" ] && kill -0 "$pg_pid" 2>/dev/null; then
		kill -INT "$pg_pid" 2>/dev/null || true # fast shutdown
		for _ in $(seq 1 300); do kill -0 "$pg_pid" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "$pg_pid" 2>/dev/null || true
	fi
	if [ -n "$redis_pid" ] && kill -0 "$redis_pid" 2>/dev/null; then
		kill -TERM "$redis_pid" 2>/dev/null || true
		for _ in $(seq 1 100); do kill -0 "$redis_pid" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "$redis_pid" 2>/dev/null || true
	fi
	rm -rf "$tmp"
	exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# find_bin NAME [DIR...]: the path of NAME on PATH or in one of the DIRs.
find_bin() {
	local name=$1 d
	shift
	if command -v "$name" >/dev/null 2>&1; then
		command -v "$name"
		return 0
	fi
	for d in "$@"; do
		if [ -x "$d/$name" ]; then
			echo "$d/$name"
			return 0
		fi
	done
	return 1
}

# need NAME PACKAGE [DIR...]: find NAME, installing PACKAGE if missing.
need() {
	local name=$1 pkg=$2
	shift 2
	if find_bin "$name" "$@"; then
		return 0
	fi
	if [ "$(id -u)" -ne 0 ]; then
		echo "$name not found: install it with: sudo sh -c 'apt-get update && apt-get install -y $pkg'" >&2
		return 1
	fi
	echo "installing $pkg ..." >&2
	DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 update >&2
	DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y --no-install-recommends "$pkg" >&2
	find_bin "$name" "$@" /usr/lib/postgresql/*/bin
}

free_port() {
	python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()' 2>/dev/null ||
		echo $((20000 + RANDOM % 20000))
}

# wait_for PID SECONDS CHECK...: until CHECK succeeds, PID dies or time runs out.
wait_for() {
	local pid=$1 secs=$2
	shift 2
	for _ in $(seq 1 $((secs * 10))); do
		if "$@" >/dev/null 2>&1; then return 0; fi
		kill -0 "$pid" 2>/dev/null || return 1
		sleep 0.1
	done
	return 1
}

if [ -z "${PROTEAN_TEST_DATABASE_URL:-}" ]; then
	# Debian keeps the server binaries off PATH.
	pg_dirs=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -rV || true)
	# shellcheck disable=SC2086
	initdb=$(need initdb postgresql $pg_dirs)
	bindir=$(dirname "$(readlink -f "$initdb")")
	as_pg=()
	if [ "$(id -u)" -eq 0 ]; then
		# PostgreSQL refuses to run as root.
		chown postgres: "$tmp" 2>/dev/null || { echo "running as root needs a postgres user" >&2; exit 1; }
		as_pg=(runuser -u postgres --)
	fi
	"${as_pg[@]}" "$bindir/initdb" -D "$tmp/pg" -A trust -U postgres -E UTF8 --no-locale --no-sync --no-instructions >"$tmp/initdb.log" 2>&1 ||
		{ cat "$tmp/initdb.log" >&2; exit 1; }
	pg_port=$(free_port)
	# exec inside the child, so that $! is the postmaster itself.
	"${as_pg[@]}" sh -c 'exec "$0" "$@"' "$bindir/postgres" -D "$tmp/pg" -p "$pg_port" -k "$tmp" \
		-c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off \
		-c max_connections=300 -c shared_buffers=128MB >"$tmp/postgres.log" 2>&1 &
	pg_pid=$!
	if [ -n "${as_pg[*]}" ]; then
		# runuser forks: find the postmaster from its pid file.
		for _ in $(seq 1 100); do [ -s "$tmp/pg/postmaster.pid" ] && break; sleep 0.1; done
		[ -s "$tmp/pg/postmaster.pid" ] && pg_pid=$(head -1 "$tmp/pg/postmaster.pid")
	fi
	pg_up() {
		if [ -x "$bindir/pg_isready" ]; then
			"$bindir/pg_isready" -q -h 127.0.0.1 -p "$pg_port"
		else
			grep -q 'ready to accept connections' "$tmp/postgres.log"
		fi
	}
	if ! wait_for "$pg_pid" 60 pg_up; then
		echo "PostgreSQL did not start:" >&2
		cat "$tmp/postgres.log" >&2
		exit 1
	fi
	export PROTEAN_TEST_DATABASE_URL="postgres://postgres@127.0.0.1:$pg_port/postgres?sslmode=disable"
fi

if [ -z "${PROTEAN_TEST_REDIS_URL:-}" ]; then
	redis=$(need redis-server redis-server)
	redis_port=$(free_port)
	"$redis" --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --dir "$tmp" --daemonize no >"$tmp/redis.log" 2>&1 &
	redis_pid=$!
	redis_up() { exec 3<>"/dev/tcp/127.0.0.1/$redis_port" && printf 'PING\r\n' >&3 && read -r -t 1 line <&3 && [ "${line%$'\r'}" = "+PONG" ]; }
	if ! wait_for "$redis_pid" 30 redis_up; then
		echo "Redis did not start:" >&2
		cat "$tmp/redis.log" >&2
		exit 1
	fi
	exec 3>&- 3<&- || true
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
