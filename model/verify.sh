#!/usr/bin/env bash
# Checks the models with spin: model/protocol.pml (the partition lease/fence
# protocol) and model/relay.pml (the outbox relay and the consumer's
# position check). Each must verify with no error, and each seeded variant
# must fail on the invariant it breaks.
# One line per run: name, bounds, states explored, result.
# VERBOSE=1 prints each variant's shortest counterexample as a message trace.
# Runs are bounded by CPU time (VERIFY_CPU seconds each, default 900) and
# memory, never by wall clock: a busy machine makes the check slower, it
# does not fail it.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)

if ! command -v spin >/dev/null 2>&1; then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
		echo "verify: spin missing, installing it (apt-get install -y spin)"
		apt-get install -y spin >/dev/null 2>&1 || { apt-get update >/dev/null 2>&1 && apt-get install -y spin >/dev/null; }
	else
		echo "verify: spin is not installed; run: sudo apt-get install -y spin" >&2
		exit 1
	fi
fi
command -v gcc >/dev/null 2>&1 || { echo "verify: gcc is not installed; run: sudo apt-get install -y gcc" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/protean-verify.XXXXXX")
trap 'rm -rf "$work"' EXIT

# run MODEL NAME EXPECT "SPIN_DEFINES" ["GCC_FLAGS" ["PAN_FLAGS"]]
# MODEL is a file in model/; EXPECT is "pass", or the text of the assertion
# the variant must violate.
run() {
	local pml=$1 name=$2 expect=$3 defs=$4 cflags=${5:-} extra=${6:-}
	local dir=$work/$name
	mkdir -p "$dir"
	cp "$here/$pml" "$dir/$pml"
	(
		cd "$dir"
		# shellcheck disable=SC2086
		spin -a $defs "$pml" >spin.log 2>&1 || { echo "FAIL $name: spin -a: $(tail -1 spin.log)"; exit 1; }
		case $cflags in *MEMLIM*) ;; *) cflags="$cflags -DMEMLIM=3072" ;; esac
		# -DREACH: -i's shortest counterexample is exact only with it.
		[ "$expect" = pass ] || cflags="$cflags -DREACH"
		# shellcheck disable=SC2086
		gcc -O2 -DSAFETY $cflags -o pan pan.c 2>gcc.log || { echo "FAIL $name: gcc: $(tail -1 gcc.log)"; exit 1; }
		# -m: search depth (the deepest path is ~200 steps); -i: when a
		# variant fails, look for its shortest counterexample.
		local panflags="-m10000 $extra"
		[ "$expect" = pass ] || panflags="$panflags -i"
		# Bounded by CPU seconds (SIGXCPU), not wall clock: on a loaded
		# machine a run takes longer but explores the same states.
		# shellcheck disable=SC2086
		( ulimit -t "${VERIFY_CPU:-900}"; exec ./pan $panflags ) >pan.log 2>&1 || true
		local states errors secs verdict
		states=$(awk '/states, stored/ {sub(/,$/, "", $1); print $1; exit}' pan.log)
		errors=$(sed -n 's/.*errors: \([0-9]*\).*/\1/p' pan.log | tail -1)
		secs=$(sed -n 's/^pan: elapsed time \([0-9.e+]*\).*/\1/p' pan.log | tail -1)
		if [ -z "$errors" ]; then
			verdict="FAIL (no result: CPU limit of ${VERIFY_CPU:-900} s or crash; $(tail -1 pan.log))"
		elif grep -q -e 'max search depth too small' -e 'reached -DMEMLIM bound' -e 'out of memory' pan.log; then
			verdict="FAIL (search incomplete: $(grep -m1 -e 'max search depth' -e MEMLIM -e 'out of memory' pan.log))"
		elif [ "$expect" = pass ]; then
			# A statement no path reaches would make the check vacuous
			# (a guard that can never be true): fail on any but the end of
			# a process's endless loop.
			unreached=$(awk '/^unreached in / {on=1; next} on && /^\t[^(]/ && !/"-end-"/ {sub(/,$/, "", $1); print $1; exit}' pan.log)
			if [ -n "$unreached" ]; then verdict="FAIL (statement never reached: $unreached)";
			elif [ "$errors" = 0 ]; then verdict="pass (errors: 0)"; else
				verdict="FAIL (errors: $errors: $(grep -m1 -e 'violated' -e 'invalid end state' pan.log || true))"; fi
		else
			if [ "$errors" = 0 ]; then
				verdict="FAIL (errors: 0, the seeded bug went undetected)"
			elif grep -qF "assertion violated ($expect)" pan.log; then
				verdict="pass (caught, errors: $errors: assertion violated ($expect))"
			else
				verdict="FAIL (errors: $errors, but not on ($expect): $(grep -m1 -e 'violated' -e 'invalid end state' pan.log || true))"
			fi
		fi
		printf '%-34s %-46s states %10s  %6ss  %s\n' "$name" "${defs:-(defaults)}" "${states:-?}" "${secs:-?}" "$verdict" >result
		if [ "$expect" != pass ] && [ "${VERBOSE:-}" = 1 ] && [ -f "$pml.trail" ]; then
			# shellcheck disable=SC2086
			spin -t $defs "$pml" 2>&1 | sed -n 's/^ *MSC: /    /p; s/^spin: text of failed assertion: /    violated: /p' >>result
		fi
		case $verdict in pass*) touch ok ;; esac
	)
}

# The configurations. The protocol runs at several bounds (owners, faults)
# and in both orders of reclaim and claim; each variant runs at the
# smallest bound that shows its bug, and must violate the named invariant.
names=()
start() {
	# Two at a time: the machines have 2 cores.
	while [ "$(jobs -rp | wc -l)" -ge 2 ]; do wait -n || true; done
	names+=("$2")
	run "$@" &
}
start protocol.pml protocol-3owners-2faults pass "-DOWNERS=3 -DMAXFAULTS=2" "-DCOLLAPSE"
# VERIFY_DEEP=1: one more bound, beyond the time budget of make verify and
# beyond exhaustive search in 8 GB (over 135 M states), so bitstate: a pass
# there is strong evidence, not proof.
[ "${VERIFY_DEEP:-}" = 1 ] && VERIFY_CPU=7200 start protocol.pml protocol-3owners-3faults-bitstate pass "-DOWNERS=3 -DMAXFAULTS=3" "-DBITSTATE" "-w33"
start protocol.pml protocol-2owners-3faults pass "-DOWNERS=2 -DMAXFAULTS=3"
start protocol.pml protocol-claim-first pass "-DOWNERS=2 -DMAXFAULTS=3 -DCLAIM_FIRST"
start protocol.pml variant-a-unfenced-reclaim 'applied[i]>0' "-DUNFENCED_RECLAIM"
start protocol.pml variant-b-no-generation-check 'applied[r[i]]==0' "-DNO_GEN_CHECK"
start protocol.pml variant-c-no-position-check 'applied[r[i]]==0' "-DNO_POS_CHECK"
# A read's lost reply, sent again (go-redis retries): safe because the read
# answers pending entries first; the read that skipped them must fail.
start protocol.pml protocol-lost-reply pass "-DOWNERS=2 -DMAXFAULTS=2 -DLOST_REPLY"
start protocol.pml variant-j-retried-read-skips-pending 'applied[i]>0' "-DLOST_REPLY -DSKIP_PENDING_ON_RETRY"
# The relay model: 3 rows of one key, 2 relays, 1 crash or stall, 1 own
# failure (abandon), 1 Redis restart (relay.pml's defaults).
start relay.pml relay-fenced pass "" "-DCOLLAPSE"
start relay.pml relay-unfenced-no-restart pass "-DUNFENCED_PUBLISH -DMAXRESTARTS=0" "-DCOLLAPSE"
start relay.pml relay-unfenced-epoch-value pass "-DUNFENCED_PUBLISH -DEPOCH_VALUE" "-DCOLLAPSE"
start relay.pml relay-lossy-redis pass "-DLOSSY" "-DCOLLAPSE"
[ "${VERIFY_DEEP:-}" = 1 ] && start relay.pml relay-fenced-writer pass "-DWRITER" "-DCOLLAPSE"
[ "${VERIFY_DEEP:-}" = 1 ] && start relay.pml relay-unfenced-epoch-writer pass "-DUNFENCED_PUBLISH -DEPOCH_VALUE -DWRITER" "-DCOLLAPSE"
start relay.pml variant-d-old-abandon 'e==(pos+1)' "-DOLD_ABANDON"
start relay.pml variant-d-old-abandon-at-the-ack 'applied[e]>0' "-DOLD_ABANDON -DNO_GAP_CHECK"
start relay.pml variant-e-no-epoch 'e==(pos+1)' "-DNO_EPOCH"
start relay.pml variant-f-recovery-keeps-claims 'e==(pos+1)' "-DRECOVER_PUBLISHED_ONLY"
start relay.pml variant-g-unfenced-marker-exists 'e==(pos+1)' "-DUNFENCED_PUBLISH"
start relay.pml variant-h-keep-past-position 'e==(pos+1)' "-DKEEP_PAST_POSITION"
start relay.pml variant-i-no-prev-check 'e==(pos+1)' "-DLOSSY -DNO_PREV_CHECK"
wait

status=0
for n in "${names[@]}"; do
	cat "$work/$n/result" 2>/dev/null || echo "FAIL $n: no result"
	[ -f "$work/$n/ok" ] || status=1
done
if [ "$status" = 0 ]; then echo "verify: ok"; else echo "verify: FAILED" >&2; fi
exit "$status"
