#!/usr/bin/env bash
# services.sh runs a private PostgreSQL and Redis for production mode on
# this machine, with the durability the guarantees assume (docs/operations.md,
# "In production"): PostgreSQL with its defaults (fsync on), and Redis with
# AOF fsynced on every write (appendonly yes, appendfsync always). Both
# listen on loopback only and keep their data in a state directory,
# PROTEAN_SERVICES_DIR (default build/services in this checkout).
#
#   eval "$(scripts/services.sh up)"   start them (or find them running); print the exports
#   scripts/services.sh env            print the exports again, e.g. for another terminal
#   scripts/services.sh down           stop them, by their own pids; the data stays
#
# up creates the role and the database protean (the role's password is
# drawn once and kept in the state directory) and prints
#   export PROTEAN_DATABASE_URL=...  export PROTEAN_REDIS_URL=...
# which configs/production.toml's stores and broker take over their
# defaults. rm -rf the state directory (after down) to start from nothing.
# Missing server binaries are installed with apt-get when running as root;
# otherwise the script says what to install.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib/services.sh
. "$here/lib/services.sh"

dir=${PROTEAN_SERVICES_DIR:-$(dirname "$here")/build/services}
# One spelling of the directory: alive finds the servers by it.
case $dir in /*) ;; *) dir=$PWD/$dir ;; esac
dir=$(realpath -m "$dir" 2>/dev/null || echo "$dir")

usage() {
	echo "usage: $0 up|down|env   (state in PROTEAN_SERVICES_DIR, default build/services)" >&2
	exit 2
}
[ "$#" -eq 1 ] || usage

# alive NAME: the pid in DIR/NAME.pid if that process runs, and is ours
# (its command line names the state directory or its Redis port).
alive() {
	local pid
	pid=$(cat "$dir/$1.pid" 2>/dev/null) || return 1
	[ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
	if [ -r "/proc/$pid/cmdline" ]; then
		tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -e "$dir" -e "$(cat "$dir/redis.port" 2>/dev/null || echo none)" || return 1
	fi
	echo "$pid"
}

print_env() {
	cat "$dir/env"
}

down() {
	local pid
	if pid=$(alive postgres); then
		echo "stopping PostgreSQL (pid $pid)" >&2
		pg_stop "$pid"
	fi
	if pid=$(alive redis); then
		echo "stopping Redis (pid $pid)" >&2
		redis_stop "$pid"
	fi
	rm -f "$dir/postgres.pid" "$dir/redis.pid"
}

# port NAME: the port NAME used before (the URLs stay the same across a
# down and an up), or a free one.
port() {
	[ -s "$dir/$1.port" ] || free_port >"$dir/$1.port"
	cat "$dir/$1.port"
}

up() {
	if [ -s "$dir/env" ] && alive postgres >/dev/null && alive redis >/dev/null; then
		echo "PostgreSQL and Redis already running (state in $dir)" >&2
		print_env
		return 0
	fi
	down # whichever of the two still runs
	mkdir -p "$dir"
	chmod 755 "$dir"

	local pg_port redis_port password
	pg_port=$(port postgres)
	redis_port=$(port redis)
	if [ ! -s "$dir/password" ]; then
		(umask 077 && od -An -N12 -tx1 /dev/urandom | tr -d ' \n' >"$dir/password")
	fi
	password=$(cat "$dir/password")

	# Over TCP a password (scram-sha-256), as a server elsewhere would ask;
	# the superuser postgres only on the Unix socket in the state directory.
	PG_HOST_AUTH=scram-sha-256 pg_start "$dir" "$pg_port" || return 1
	echo "$PG_PID" >"$dir/postgres.pid"
	psql=("$PG_BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -h "$dir" -p "$pg_port" -U postgres -d postgres)
	if [ -z "$("${psql[@]}" -Atc "SELECT 1 FROM pg_roles WHERE rolname = 'protean'")" ]; then
		"${psql[@]}" -c "CREATE ROLE protean LOGIN PASSWORD '$password'"
	fi
	if [ -z "$("${psql[@]}" -Atc "SELECT 1 FROM pg_database WHERE datname = 'protean'")" ]; then
		"${psql[@]}" -c "CREATE DATABASE protean OWNER protean"
	fi

	mkdir -p "$dir/redis"
	redis_start "$dir/redis" "$redis_port" --appendonly yes --appendfsync always --save '' || return 1
	echo "$REDIS_PID" >"$dir/redis.pid"

	cat >"$dir/env" <<-ENV
		export PROTEAN_DATABASE_URL='postgres://protean:$password@127.0.0.1:$pg_port/protean?sslmode=disable'
		export PROTEAN_REDIS_URL='redis://127.0.0.1:$redis_port/0'
	ENV
	echo "PostgreSQL on 127.0.0.1:$pg_port (pid $(cat "$dir/postgres.pid")), Redis on 127.0.0.1:$redis_port (pid $REDIS_PID, AOF appendfsync always); state in $dir; stop them with: $0 down" >&2
	print_env
}

case $1 in
up) up ;;
down) down ;;
env)
	if [ ! -s "$dir/env" ] || ! alive postgres >/dev/null || ! alive redis >/dev/null; then
		echo "not running: $0 up starts them" >&2
		exit 1
	fi
	print_env
	;;
*) usage ;;
esac
