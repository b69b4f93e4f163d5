#!/usr/bin/env bash
# scripts/dev.sh PLUGINS_DIR CONFIG MODULE_DIR... — the author's loop behind
# `make dev`: build every module directory into PLUGINS_DIR, start the host
# with --watch on it, and rebuild a module whenever a file of its directory
# changes; the host's watcher then reloads it. A module directory is a Go
# main package (its own go.mod, as `protean-host plugin new` writes, or a
# package of this repository such as plugins/examples/orders); the module
# file is named after the directory. A build that fails leaves the running
# module in place and prints the compiler's errors.
#
# After a rebuild the script says what the host made of it (tell): "live"
# with the module's version once GET /v1/plugins serves the SHA-256 just
# built, or "rejected" with the host's reason (the running version keeps
# serving), or, after DEV_WAIT seconds (default 30), that it could not
# tell. It asks the address the host logs as listening (DEV_ADDR
# overrides), with DEV_TOKEN as bearer key when the host has credentials.
#
# Polling (every DEV_POLL seconds, default 1) rather than inotify: nothing
# to install, and a build takes longer than the poll anyway. A new module
# is written under a temporary name and renamed, so the watcher never reads
# a half-written file.
set -u
plugins=$1 config=$2
shift 2
host=${HOST_BIN:-build/protean-host}
poll=${DEV_POLL:-1}
mkdir -p "$plugins"
plugins=$(cd "$plugins" && pwd)

# build DIR: compile the module of DIR into $plugins/NAME.wasm.
build() {
	local dir=$1 name out
	name=$(basename "$dir")
	out=$plugins/$name.wasm
	if (cd "$dir" && GOOS=wasip1 GOARCH=wasm CGO_ENABLED=0 go build -trimpath -buildmode=c-shared -o "$out.tmp" .); then
		mv "$out.tmp" "$out"
		echo "dev: built $dir -> $out"
	else
		rm -f "$out.tmp"
		echo "dev: build of $dir failed; the running module is unchanged"
		return 1
	fi
}

# tell NAME: wait for the host to report NAME.wasm at the bytes just
# built: served ("live"), or refused ("rejected", with the reason).
# Matches GET /v1/plugins' compact JSON with sed: no jq needed.
tell() {
	local name=$1 file sum n addr body v err deadline auth=()
	file=$plugins/$name.wasm
	[ -n "${DEV_TOKEN:-}" ] && auth=(-H "Authorization: Bearer $DEV_TOKEN")
	if ! command -v curl >/dev/null 2>&1; then
		echo "dev: $name built; without curl the script cannot tell whether the host took it"
		return 0
	fi
	sum=$( (sha256sum "$file" 2>/dev/null || shasum -a 256 "$file") | cut -d' ' -f1)
	n=$(printf '%s' "$name" | sed 's/\./\\./g')
	deadline=$(($(date +%s) + ${DEV_WAIT:-30}))
	while [ "$(date +%s)" -le "$deadline" ]; do
		addr=${DEV_ADDR:-$(sed -n 's/.*msg=listening .*admin_addr=\([^ ]*\).*/\1/p' "$hostlog" 2>/dev/null | tail -n 1)}
		if [ -n "$addr" ] && body=$(curl -fsS --max-time 2 ${auth[@]+"${auth[@]}"} "http://$addr/v1/plugins" 2>/dev/null); then
			v=$(printf '%s' "$body" | sed -nE 's/.*"file":"'"$n"'\.wasm","name":"[^"]*","version":"([^"]*)","sha256":"'"$sum"'".*/\1/p')
			if [ -n "$v" ]; then
				echo "dev: $name live (version $v)"
				return 0
			fi
			err=$(printf '%s' "$body" | sed -nE 's/.*"rejected":\{"file":"'"$n"'\.wasm","sha256":"'"$sum"'","error":"(([^"\\]|\\.)*)".*/\1/p')
			if [ -n "$err" ]; then
				err=$(printf '%s' "$err" | sed -e 's/\\u003c/</g' -e 's/\\u003e/>/g' -e 's/\\u0026/\&/g' -e 's/\\"/"/g' -e 's/\\n/ /g' -e 's/\\\\/\\/g')
				echo "dev: $name rejected: $err"
				return 1
			fi
		fi
		sleep 0.5
	done
	echo "dev: $name built, but the host did not report it within ${DEV_WAIT:-30}s (GET /v1/plugins on ${addr:-an address not yet logged}); cannot tell whether it is live"
	return 1
}

# Each module has a stamp file, touched just before its build: a source
# file newer than it is a change (one made during a build triggers the
# next). POSIX find and plain files, no bash 4 or GNU find needed.
stamps=$(mktemp -d)
trap 'rm -rf "$stamps"' EXIT
stamp() { echo "$stamps/$(basename "$1")"; }
changed() {
	[ -n "$(find "$1" -type f \( -name '*.go' -o -name go.mod -o -name go.sum \) -newer "$(stamp "$1")" -print | head -n 1)" ]
}

for d in "$@"; do
	touch "$(stamp "$d")"
	build "$d" || exit 1
done

# RUN_FLAGS: more flags for run (word-split on purpose), e.g. --listen.
# shellcheck disable=SC2086
# The host's log goes to the terminal and to hostlog, where tell finds the
# address it listens on.
hostlog=$stamps/.host.log
"$host" run --config "$config" --plugins "$plugins" --watch ${RUN_FLAGS:-} 2> >(tee "$hostlog" >&2) &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid; exit' INT TERM
trap 'kill $pid 2>/dev/null; rm -rf "$stamps"' EXIT
echo "dev: host pid $pid, plugins $plugins; watching $* (Ctrl-C stops)"
while kill -0 "$pid" 2>/dev/null; do
	sleep "$poll"
	for d in "$@"; do
		if changed "$d"; then
			touch "$(stamp "$d")"
			build "$d" && tell "$(basename "$d")"
		fi
	done
done
wait "$pid"
