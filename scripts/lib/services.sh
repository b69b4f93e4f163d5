# shellcheck shell=bash
# services.sh (sourced, not run): finding, starting and stopping a private
# PostgreSQL and Redis, shared by scripts/test-services.sh (throwaway
# servers for tests) and scripts/services.sh (servers for production mode
# that outlive the script).
#
# Missing server binaries are installed with apt-get when running as root;
# otherwise the functions say what to install and fail.

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

# stop_pid PID SIGNAL SECONDS: send SIGNAL, wait up to SECONDS for PID to
# exit, then kill it.
stop_pid() {
	local pid=$1 sig=$2 secs=$3
	[ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
	kill "-$sig" "$pid" 2>/dev/null || true
	for _ in $(seq 1 $((secs * 10))); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
	kill -KILL "$pid" 2>/dev/null || true
}

# As root, PostgreSQL's binaries run as the postgres user (it refuses root).
as_pg=()
if [ "$(id -u)" -eq 0 ]; then
	as_pg=(runuser -u postgres --)
fi

# pg_bindir: the directory of initdb, postgres and psql (Debian keeps them
# off PATH), installing PostgreSQL if needed.
pg_bindir() {
	local dirs initdb
	dirs=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -rV || true)
	# shellcheck disable=SC2086
	initdb=$(need initdb postgresql $dirs) || return 1
	dirname "$(readlink -f "$initdb")"
}

# pg_start DIR PORT [POSTGRES-ARG...]: a PostgreSQL cluster in DIR/pg
# (initdb'd if new: superuser postgres, trusted on the Unix socket in DIR
# only, a password over TCP when PG_HOST_AUTH is scram-sha-256, trusted
# otherwise), started on 127.0.0.1:PORT with its log in DIR/postgres.log.
# Sets PG_PID (the postmaster) and PG_BINDIR; fails with the log if it
# does not accept connections within 60 s.
pg_start() {
	local dir=$1 port=$2
	shift 2
	PG_BINDIR=$(pg_bindir) || return 1
	if [ -n "${as_pg[*]}" ]; then
		chown postgres: "$dir" 2>/dev/null || { echo "running as root needs a postgres user" >&2; return 1; }
		"${as_pg[@]}" test -x "$dir" || { echo "the postgres user cannot enter $dir: make its parent directories searchable (chmod o+x)" >&2; return 1; }
	fi
	if [ ! -s "$dir/pg/PG_VERSION" ]; then
		"${as_pg[@]}" "$PG_BINDIR/initdb" -D "$dir/pg" -U postgres -E UTF8 --no-locale --no-instructions \
			--auth-local=trust --auth-host="${PG_HOST_AUTH:-trust}" ${PG_INITDB_FLAGS:-} >"$dir/initdb.log" 2>&1 ||
			{ cat "$dir/initdb.log" >&2; return 1; }
	fi
	# exec inside the child, so that $! is the postmaster itself (setsid, where
	# there is one, execs in place too, and keeps it and runuser out of the
	# caller's process group and its terminal's signals).
	local detach=()
	command -v setsid >/dev/null 2>&1 && detach=(setsid)
	"${detach[@]}" "${as_pg[@]}" sh -c 'exec "$0" "$@"' "$PG_BINDIR/postgres" -D "$dir/pg" -p "$port" -k "$dir" \
		-c listen_addresses=127.0.0.1 "$@" </dev/null >"$dir/postgres.log" 2>&1 &
	PG_PID=$!
	if [ -n "${as_pg[*]}" ]; then
		# runuser forks: find the postmaster from its pid file.
		for _ in $(seq 1 100); do [ -s "$dir/pg/postmaster.pid" ] && break; sleep 0.1; done
		[ -s "$dir/pg/postmaster.pid" ] && PG_PID=$(head -1 "$dir/pg/postmaster.pid")
	fi
	pg_up() {
		if [ -x "$PG_BINDIR/pg_isready" ]; then
			"$PG_BINDIR/pg_isready" -q -h 127.0.0.1 -p "$port"
		else
			grep -q 'ready to accept connections' "$dir/postgres.log"
		fi
	}
	if ! wait_for "$PG_PID" 60 pg_up; then
		echo "PostgreSQL did not start:" >&2
		cat "$dir/postgres.log" >&2
		return 1
	fi
}

# pg_stop PID: a fast shutdown (SIGINT), killed after 30 s.
pg_stop() { stop_pid "$1" INT 30; }

# redis_start DIR PORT [REDIS-ARG...]: a Redis on 127.0.0.1:PORT with its
# files in DIR and its log in DIR/redis.log. Sets REDIS_PID; fails with the
# log if it does not answer PING within 30 s.
redis_start() {
	local dir=$1 port=$2 redis
	shift 2
	redis=$(need redis-server redis-server) || return 1
	local detach=()
	command -v setsid >/dev/null 2>&1 && detach=(setsid)
	"${detach[@]}" "$redis" --port "$port" --bind 127.0.0.1 --dir "$dir" --daemonize no "$@" </dev/null >"$dir/redis.log" 2>&1 &
	REDIS_PID=$!
	if ! wait_for "$REDIS_PID" 30 redis_ping "$port"; then
		echo "Redis did not start:" >&2
		cat "$dir/redis.log" >&2
		return 1
	fi
}

# redis_ping PORT: whether the Redis on 127.0.0.1:PORT answers PONG.
redis_ping() {
	local line
	(exec 3<>"/dev/tcp/127.0.0.1/$1" && printf 'PING\r\n' >&3 && read -r -t 1 line <&3 && [ "${line%$'\r'}" = "+PONG" ])
}

# redis_stop PID: SIGTERM (Redis flushes its AOF and exits), killed after 30 s.
redis_stop() { stop_pid "$1" TERM 30; }
