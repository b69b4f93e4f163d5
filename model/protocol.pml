/*
 * The partition lease/fence protocol of docs/partitions.md, for spin.
 *
 * One unit (consumer group, partition) reading one stream. A publisher
 * appends N entries; entry i carries global position i. OWNERS owner
 * processes run the protocol: acquire the Redis lease, reclaim the pending
 * entries of earlier generations (fenced XAUTOCLAIM), claim the PostgreSQL
 * positions row, then loop: fenced read ('0' then '>'), dedupe against the
 * known position, the effect transaction (generation check + position
 * check), fenced ack. Every Lua script and every PostgreSQL transaction is
 * one indivisible step (d_step). Time is abstract: a lease expires by a
 * nondeterministic event, free when nobody renews it, a counted fault when
 * its owner is alive but paused (a stall). A crash is a counted fault too.
 *
 * Seeded variants, each must fail:
 *   -DUNFENCED_RECLAIM  XAUTOCLAIM without the lease check
 *   -DNO_GEN_CHECK      the effect transaction ignores the row's generation
 *   -DNO_POS_CHECK      no position check in the transaction, no dedupe
 *
 * -DLOST_REPLY adds a counted fault: a read's reply is lost after Redis
 * ran it (the entries it delivered are in the owner's pending list, the
 * owner never saw them), and the owner sends the read again, as go-redis
 * does. The read answers the owner's pending entries first whatever it
 * asks for (readScript), so the retry is the same step. With
 * -DSKIP_PENDING_ON_RETRY the retried read goes to new entries only (the
 * read before that fix, for an owner that had drained its pending list):
 * it must fail.
 *
 * What the model does not distinguish: the read script answers the ids it
 * delivered and the worker reads their bodies with a plain XRANGE (an
 * entry is immutable, so the READ step here is the same), and a new owner
 * sends its reclaim, its drop of stale consumers and its first read in one
 * pipeline (Leases.Take): three fenced steps, each checked on its own, in
 * the order RECLAIM then READ that the model runs (with -DCLAIM_FIRST, the
 * worker's order: the positions claim comes first).
 */

#ifndef N
#define N 3              /* entries published */
#endif
#ifndef OWNERS
#define OWNERS 2         /* owner processes */
#endif
#ifndef MAXFAULTS
#define MAXFAULTS 2      /* crashes + stalls (expiries of a live owner's lease) */
#endif
/* A fenced read returns at most 2 entries (the batch); the worker commits
 * a nonempty prefix of the undeduplicated ones in one transaction (a guest
 * failure at message k commits the results before k) and leaves the rest
 * pending, re-read through '0'. */

/* ---- Redis ---- */
byte lease;              /* fence token (= generation) of the holder; 0: none */
byte leaseOwner;         /* owner process holding it */
byte genCounter;         /* {group}:{unit}:__generation__, never reset */
byte published;          /* the stream holds entries 1..published */
byte lastDelivered;      /* the group's last-delivered id */
byte pel[N+1];           /* pel[i]: consumer (token) whose PEL holds entry i; 0: not pending */

/* ---- PostgreSQL consumer_positions row ---- */
byte pgGen;              /* the row's generation */
byte pgPos;              /* the position of the last entry whose effects committed */

/* ---- effects log ---- */
byte applied[N+1];       /* times entry i's effects committed */
byte maxApplied;         /* highest position applied so far */

/* ---- environment ---- */
byte faults;             /* crashes and stalls so far */
bool held[OWNERS];       /* the owner believes it owns the unit (and renews its lease) */
bool finished;           /* some owner ran to completion */

/* outcomes of a step (res) */
#define OK      0
#define LOST    1        /* fenced out: in Redis (lease) or PostgreSQL (generation) */
#define EMPTY   2
#define DONE    3
#define APPLIED 4

#ifdef NO_GEN_CHECK
#define GEN_OK  true
#else
#define GEN_OK  (pgGen == myPg)
#endif
#ifdef NO_POS_CHECK
#define POS_OK  true
#define DUP(e)  false
#else
#define POS_OK  (r[k-1] > pgPos)
#define DUP(e)  ((e) <= myPos)
#endif

/* An owner may vanish between any two of its steps: its lease is no
 * longer renewed (held false) and lapses through Clock. CRASH is one more
 * option of the choice before each step, so a crash point costs no state of
 * its own; a crashed owner's locals are cleared so its dead states merge. */
#define CRASH \
	:: res != LOST && faults < MAXFAULTS -> \
		d_step { faults++; held[me] = false; printf("MSC: owner %d crashes\n", me); \
		         tok = 0; myPg = 0; myPos = 0; bn = 0; b[0] = 0; b[1] = 0; rn = 0; r[0] = 0; r[1] = 0; k = 0; res = 0; retried = false }; \
		goto crashed

/* CLAIM the positions row: generation + 1, read the position. By default
 * after the reclaim; -DCLAIM_FIRST checks the other order. */
#define CLAIM \
	d_step { pgGen++; myPg = pgGen; myPos = pgPos; \
	         printf("MSC: owner %d claims the row: pg gen %d, position %d\n", me, myPg, myPos) }

proctype Owner(byte me)
{
	byte tok;            /* my fence token = Redis generation = my consumer name */
	byte myPg;           /* my PostgreSQL generation */
	byte myPos;          /* last position I know applied */
	byte b[2]; byte bn;  /* the batch a read returned, in id order */
	byte r[2]; byte rn;  /* its entries past myPos, to hand to the handler */
	byte k;              /* how many of r this transaction commits */
	bool retried;        /* the read is sent again after a lost reply */
	byte res;            /* the outcome of the last step */
	byte i;

acquire:
	/* ACQUIRE: if no lease, generation + 1 and SET lease token */
	if
	:: d_step { lease == 0 -> genCounter++; tok = genCounter; lease = tok; leaseOwner = me; held[me] = true; res = OK;
	            printf("MSC: owner %d acquires gen %d\n", me, tok) }
	:: finished -> goto stop   /* another owner drained everything */
	fi;
#ifdef CLAIM_FIRST
	if
	CRASH
	:: res != LOST -> CLAIM
	fi;
#endif

	/* RECLAIM: XAUTOCLAIM every pending entry of the group into my consumer */
	if
	CRASH
	:: res != LOST ->
		d_step {
#ifndef UNFENCED_RECLAIM
			if
			:: lease != tok -> res = LOST
			:: else ->
#endif
				res = OK;
				i = 1;
				do
				:: i <= N -> if :: pel[i] != 0 -> pel[i] = tok :: else fi; i++
				:: else -> break
				od;
				i = 0;
				printf("MSC: owner %d (gen %d) reclaims every pending entry\n", me, tok)
#ifndef UNFENCED_RECLAIM
			fi
#endif
		}
	fi;
#ifndef CLAIM_FIRST
	if
	:: res == LOST -> goto lost
	CRASH
	:: res != LOST -> CLAIM
	fi;
#endif

loop:
	/* READ: fenced XREADGROUP, my pending entries ('0') first, else new ones ('>') */
	if
	:: res == LOST -> goto lost
	CRASH
	:: res != LOST ->
	d_step {
		bn = 0; b[0] = 0; b[1] = 0; rn = 0; r[0] = 0; r[1] = 0; k = 0;
		if
		:: lease != tok -> res = LOST
		:: else ->
#ifdef SKIP_PENDING_ON_RETRY
			if
			:: retried -> i = N + 1
			:: else -> i = 1
			fi;
#else
			i = 1;
#endif
			retried = false;
			do
			:: i <= N && bn < 2 -> if :: pel[i] == tok -> b[bn] = i; bn++ :: else fi; i++
			:: else -> break
			od;
			if
			:: bn == 0 ->
				do
				:: lastDelivered < published && bn < 2 ->
					lastDelivered++; pel[lastDelivered] = tok; b[bn] = lastDelivered; bn++
				:: else -> break
				od
			:: else
			fi;
			i = 0;
			if
			:: bn == 0 && published == N ->
				res = DONE;
				/* invariant 3, no loss: a surviving owner found nothing left */
				do
				:: i < N -> i++; printf("MSC: owner %d finds the stream drained; %d applied %d times\n", me, i, applied[i]); assert(applied[i] > 0)
				:: else -> break
				od;
				i = 0
			:: bn == 0 && published < N -> res = EMPTY
			:: else ->
				res = OK;
				printf("MSC: owner %d (gen %d) reads [%d %d]\n", me, tok, b[0], b[1]);
				/* dedupe: an entry at or below my known position was applied */
				do
				:: i < bn -> if :: !DUP(b[i]) -> r[rn] = b[i]; rn++ :: else fi; i++
				:: else -> break
				od;
				i = 0
			fi
		fi
	}
	fi;

#ifdef LOST_REPLY
	/* the read's reply is lost: what it delivered stays pending, unseen */
	if
	:: res == OK && faults < MAXFAULTS ->
		d_step { faults++; printf("MSC: owner %d loses the reply of its read [%d %d] and sends it again\n", me, b[0], b[1]);
		         bn = 0; b[0] = 0; b[1] = 0; rn = 0; r[0] = 0; r[1] = 0; retried = true };
		goto loop
	:: true
	fi;
#endif
	/* the run to commit: all of r, or (the guest failed at the second) the first */
	if
	:: res == LOST -> goto lost
	:: res == EMPTY -> goto loop
	:: res == DONE -> goto finish
	CRASH
	:: res == OK && rn == 0 -> goto ack   /* all duplicates: ack without effects */
	:: res == OK && rn > 0 -> k = rn
	:: res == OK && rn > 1 -> k = 1
	fi;

	/* EFFECT transaction: the handler's effects and the position, atomically */
	d_step {
		if
		:: !GEN_OK -> res = LOST; printf("MSC: owner %d: commit refused, fenced\n", me)
		:: else ->
			if
			:: !POS_OK -> res = APPLIED; myPos = pgPos; printf("MSC: owner %d: commit refused, applied\n", me)
			:: else ->
				res = OK;
				i = 0;
				do
				:: i < k ->
					printf("MSC: owner %d (pg gen %d) applies %d\n", me, myPg, r[i]);
					assert(applied[r[i]] == 0);    /* invariant 2: exactly-once effect */
					assert(r[i] > maxApplied);     /* invariant 1: publish order */
					applied[r[i]]++; maxApplied = r[i]; i++
				:: else -> break
				od;
				i = 0;
				pgPos = r[k-1]; myPos = pgPos
			fi
		fi
	};

ack:
	/* ACK (fenced XACK): the batch but for the uncommitted tail */
	if
	:: res == LOST -> goto lost
	CRASH
	:: res != LOST ->
	d_step {
		if
		:: lease != tok -> res = LOST
		:: else ->
			res = OK;
			i = 0;
			do
			:: i < bn -> if :: !(k == 1 && rn == 2 && b[i] == r[1]) -> pel[b[i]] = 0; printf("MSC: owner %d acks %d\n", me, b[i]) :: else fi; i++
			:: else -> break
			od;
			i = 0
		fi
	}
	fi;
	goto loop;

lost:
	/* fenced out (Redis or PostgreSQL): drop the unit, stop renewing, start over */
	atomic { printf("MSC: owner %d (gen %d) fenced out, drops the unit\n", me, tok); held[me] = false;
	         tok = 0; myPg = 0; myPos = 0; bn = 0; b[0] = 0; b[1] = 0; rn = 0; r[0] = 0; r[1] = 0; k = 0; res = 0 };
	goto acquire;

finish:
	/* RELEASE: graceful hand-off */
	atomic { if :: lease == tok -> lease = 0; leaseOwner = 0 :: else fi; held[me] = false; finished = true;
	         tok = 0; myPg = 0; myPos = 0; res = 0 };
stop:
crashed:
	skip
}

/* Lease expiry, in abstract time. */
active proctype Clock()
{
end:
	do
	:: d_step { lease != 0 && !held[leaseOwner] -> printf("MSC: lease of owner %d lapses\n", leaseOwner); lease = 0; leaseOwner = 0 }                           /* nobody renews it */
	:: d_step { lease != 0 && held[leaseOwner] && faults < MAXFAULTS -> faults++;
	            printf("MSC: owner %d stalls, its lease expires\n", leaseOwner); lease = 0; leaseOwner = 0 } /* its owner stalls past the TTL */
	od
}

active proctype Publisher()
{
	do
	:: published < N -> d_step { published++; printf("MSC: publish %d\n", published) }
	:: else -> break
	od
}

init {
	atomic {
		byte p = 0;
		do
		:: p < OWNERS -> run Owner(p); p++
		:: else -> break
		od
	}
}
