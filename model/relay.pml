/*
 * The outbox relay and the consumer's check of what it has applied, for
 * spin (issue 17, item 6).
 *
 * One ordering key. A writer commits outbox rows 1..N in order (commit
 * order = global position order). RELAYS relay processes claim the key's
 * ready run (from the first row not published, up to the first row that is
 * not eligible), publish it in order to one Redis stream, stop at the first
 * failure, then mark. The consumer reads the stream in order: an entry at or
 * below its recorded position is acked as already applied; any other is
 * applied and the position advanced in one commit, then acked.
 *
 * Faults: a relay crashes (its locks lapse) or stalls past its claim's lock
 * (its locks lapse, it goes on later with its old claim), at most MAXFAULTS
 * in all; a message fails on its own past its retries and is abandoned, at
 * most MAXOWN times; the broker is down (an infrastructure failure, any
 * number of times); Redis restarts empty (entries and epoch marker gone),
 * at most MAXRESTARTS times. An operator retries abandoned rows.
 *
 * Every Lua script and every PostgreSQL transaction is one step (d_step).
 *
 * Options:
 *   -DUNFENCED_PUBLISH  a relay whose claim lapsed can still publish (the
 *                       lock is in PostgreSQL, the publish in Redis: the
 *                       default, a publish fenced by the lock, is an ideal)
 *   -DEPOCH_VALUE       the marker holds an epoch number; a relay reads it
 *                       before it claims and its publishes require that
 *                       value (the default: require that a marker exists)
 * Seeded variants, each must fail:
 *   -DOLD_ABANDON       an abandoned row no longer holds back its key
 *   -DNO_EPOCH          publish without the marker check (into a Redis
 *                       restarted empty, before the recovery)
 *   -DRECOVER_PUBLISHED_ONLY  the recovery requeues published rows but
 *                       leaves claimed ones to their relays
 *   -DNO_GAP_CHECK      drops invariant 2's check (to show the loss at the
 *                       ack that follows the gap)
 *   -DKEEP_PAST_POSITION  the recovery's keep rule keeps one row past what
 *                       the consumer applied (an off-by-one in the rule)
 *   -DNO_PREV_CHECK     the consumer applies an entry whose prev is past its
 *                       position (with -DLOSSY)
 * Fault options:
 *   -DLOSSY             Redis drops an entry it acknowledged, once, without a
 *                       restart (nothing tells the relay); the consumer's
 *                       prev check halts the key instead of applying past it
 */

#ifndef N
#define N 3              /* rows of the key */
#endif
#ifndef RELAYS
#define RELAYS 2
#endif
#ifndef BATCH
#define BATCH 2          /* a claim's limit: 1 or BATCH rows */
#endif
#ifndef MAXFAULTS
#define MAXFAULTS 1      /* relay crashes + stalls */
#endif
#ifndef MAXOWN
#define MAXOWN 1         /* a message's own failures past its retries (abandon) */
#endif
#ifndef MAXRESTARTS
#define MAXRESTARTS 1    /* Redis restarts, empty */
#endif
#define SLEN (N + 4)     /* stream capacity (asserted never reached) */

/* ---- PostgreSQL: the outbox rows of the key, the consumer's position ---- */
#define PEND 0           /* pending, or failed and waiting for a retry (due at any later time) */
#define PUB  1           /* published */
#define ABAN 2           /* abandoned past its retries */
byte committed;          /* rows 1..committed exist */
byte st[N+2];            /* st[i]: status of row i */
byte lock[N+2];          /* lock[i]: relay id + 1 holding row i's claim; 0: none */
byte nAban;              /* rows abandoned */
byte pos;                /* the consumer's recorded position */
byte applied[N+1];       /* times row i's effects committed */

/* ---- Redis ---- */
chan stream = [SLEN] of { byte, byte };   /* the key's partition stream: (row id, prev) in entry order */
byte marker = 1;         /* the epoch marker: 0 gone; else its epoch */
byte epochs = 1;         /* epochs the recovery has set */
byte redisGen;           /* restarts so far (a restart changes entry ids) */

/* ---- environment ---- */
byte faults;             /* relay crashes + stalls */
byte owns;               /* own failures */
byte lost;               /* entries a lossy Redis dropped (LOSSY) */
bool halted;             /* the consumer halted the key on a gap */
bool inPass[RELAYS];     /* relay is between its claim and its marks */

/* A row the claim skips over: published (old design: or abandoned). */
#ifdef OLD_ABANDON
#define SKIP(i) (st[i] == PUB || st[i] == ABAN)
#else
#define SKIP(i) (st[i] == PUB)
#endif
/* A row the claim may take: pending or failed and due, not locked by a live claim.
 * Abandoned rows are never eligible: in the new design they stop the run. */
#define ELIG(i) (st[i] == PEND && lock[i] == 0)
/* READY: the key's ready run is nonempty (N <= 4). */
#define R5 false
#define R4 (4 <= committed && (SKIP(4) -> R5 : ELIG(4)))
#define R3 (3 <= committed && (SKIP(3) -> R4 : ELIG(3)))
#define R2 (2 <= committed && (SKIP(2) -> R3 : ELIG(2)))
#define R1 (1 <= committed && (SKIP(1) -> R2 : ELIG(1)))
#define READY R1

/* The publish script's precondition: the epoch marker, and the claim's lock. */
#ifdef NO_EPOCH
#define MARKER_OK true
#elif defined(EPOCH_VALUE)
#define MARKER_OK (marker != 0 && marker == myEp)
#else
#define MARKER_OK (marker != 0)
#endif
#ifdef UNFENCED_PUBLISH
#define FENCE_OK true
#else
#define FENCE_OK (lock[r] == me + 1)
#endif

/* outcomes of a publish */
#define OK    0
#define INFRA 1          /* broker down, no marker (or another epoch), claim lapsed: retry */
#define OWN   2          /* the message's own failure past its retries: abandon */

/* A crash: the relay vanishes; its locks lapse (at once: a lock that stays
 * until its expiry only delays the others). It counts as a fault. */
#define CRASH \
	:: faults < MAXFAULTS -> \
		d_step { faults++; inPass[me] = false; \
		         i = 1; do :: i <= N -> if :: lock[i] == me + 1 -> lock[i] = 0 :: else fi; i++ :: else -> break od; \
		         printf("MSC: relay %d crashes\n", me); \
		         cl[0] = 0; cl[1] = 0; pv[0] = 0; pv[1] = 0; cn = 0; j = 0; r = 0; res = 0; myEp = 0; i = 0 }; \
		goto top

proctype Relay(byte me)
{
	byte cl[BATCH];      /* my claimed run, in commit order */
	byte pv[BATCH];      /* prev of each: the row before it on the stream, as the claim reads it */
	byte cn;             /* its length */
	byte j;              /* rows of it published so far */
	byte r;              /* the row being published */
	byte res;            /* outcome of the last publish */
	byte myEp;           /* the epoch I read before claiming (EPOCH_VALUE) */
	byte i;

top:
#ifdef EPOCH_VALUE
	myEp = marker;       /* GET the marker, before the claim */
#endif
end_claim:
	/* CLAIM (one statement): the ready run, up to 1 or BATCH rows */
	atomic {
		READY ->
		if
		:: cn = 1
		:: cn = BATCH
		fi;
		d_step {
			i = 1; j = 0;
			do
			:: i <= committed && SKIP(i) -> i++
			:: else -> break
			od;
			do
			:: i <= committed && j < cn && ELIG(i) -> cl[j] = i; lock[i] = me + 1; j++; i++
			:: else -> break
			od;
			cn = j; j = 0;
			/* prev of the first: the newest published row before it (the
			 * claim statement reads it); of the next: the first */
			i = cl[0] - 1;
			do
			:: i > 0 && st[i] != PUB -> i--
			:: else -> break
			od;
			pv[0] = i; pv[1] = cl[0];
			i = 0;
#ifdef ONE_CLAIM
			/* exploration: no other claim holds a row of the key */
			i = 1; do :: i <= N -> assert(lock[i] == 0 || lock[i] == me + 1); i++ :: else -> break od; i = 0;
#endif
			inPass[me] = true;
			printf("MSC: relay %d claims [%d %d]\n", me, cl[0], cl[1])
		}
	};

	/* PUBLISH the run in order, stop at the first failure */
	do
	:: j < cn ->
		if
		CRASH
		:: d_step {
				r = cl[j];
				if
				:: MARKER_OK && FENCE_OK -> res = OK; assert(nfull(stream)); stream!r,pv[j];
					printf("MSC: relay %d publishes %d\n", me, r)
				:: else -> res = INFRA; printf("MSC: relay %d: publish of %d refused\n", me, r)
				fi
			}
		:: d_step { r = cl[j]; res = INFRA; printf("MSC: relay %d: broker down at %d\n", me, r) }
		:: owns < MAXOWN -> d_step { r = cl[j]; owns++; res = OWN; printf("MSC: relay %d: %d fails past its retries\n", me, r) }
		fi;
		if
		:: res == OK -> j++
		:: else ->
			/* MARK FAILED (only by the lock holder): retry later, or abandon */
			d_step {
				if
				:: lock[r] == me + 1 ->
					lock[r] = 0;
					if
					:: res == OWN -> st[r] = ABAN; nAban++; printf("MSC: relay %d abandons %d\n", me, r)
					:: else -> printf("MSC: relay %d marks %d failed\n", me, r)
					fi
				:: else -> printf("MSC: relay %d: mark of %d refused, not the owner\n", me, r)
				fi
			};
			break
		fi
	:: else -> break
	od;

	/* MARK the published rows, RELEASE the rest (only by the lock holder) */
	if
	CRASH
	:: d_step {
		i = 0;
		do
		:: i < cn ->
			if
			:: lock[cl[i]] == me + 1 ->
				lock[cl[i]] = 0;
				if :: i < j -> st[cl[i]] = PUB; printf("MSC: relay %d marks %d published\n", me, cl[i]) :: else fi
			:: else
			fi;
			i++
		:: else -> break
		od;
		inPass[me] = false;
		cl[0] = 0; cl[1] = 0; pv[0] = 0; pv[1] = 0; cn = 0; j = 0; r = 0; res = 0; myEp = 0; i = 0
	   }
	fi;
	goto top
}

/* The consumer: reads its stream in order; acks an entry at or below its
 * position as applied; applies any other and advances its position in one
 * commit; then acks. */
active proctype Consumer()
{
	byte e;              /* the entry read */
	byte p;              /* its prev */
end:
	do
	:: halted -> break
	:: d_step {
		!halted && nempty(stream) -> stream?e,p;
		/* the effect transaction, with the position; then XACK */
		if
		:: e <= pos ->
			printf("MSC: consumer acks %d as applied (position %d)\n", e, pos);
			assert(applied[e] > 0)            /* invariant 3: an entry acked as applied was */
#ifndef NO_PREV_CHECK
		:: e > pos && p > pos && pos > 0 ->
			/* the stream lacks what lies between: halt the key (ErrGap)
			 * rather than apply past it; the check is blind while
			 * nothing is applied yet (pos 0), as the worker's is */
			printf("MSC: consumer halts at %d: prev %d is past its position %d\n", e, p, pos);
			assert(lost > 0);                 /* invariant 5: no halt unless Redis lost a write */
			halted = true
#endif
		:: else ->
			printf("MSC: consumer applies %d (position %d)\n", e, pos);
			assert(applied[e] == 0);          /* invariant 1: exactly once */
#ifndef NO_GAP_CHECK
			assert(e == pos + 1);             /* invariant 2: in commit order, no gap */
#endif
			applied[e]++; pos = e
		fi;
		e = 0; p = 0
	   }
	od
}

#ifdef WRITER
/* rows commit one by one while the relays run (default: all committed at the start) */
active proctype Writer()
{
	do
	:: committed < N -> committed++; printf("MSC: commit row %d\n", committed)
	:: else -> break
	od
}
#endif

/* Redis restarts empty; relays stall past their locks. */
active proctype Env()
{
	byte i;
end:
	do
	:: d_step { redisGen < MAXRESTARTS -> redisGen++; marker = 0;
	            do :: nempty(stream) -> stream?_,_ :: empty(stream) -> break od;
	            printf("MSC: Redis restarts empty\n") }
	:: d_step { faults < MAXFAULTS && inPass[0] -> faults++; inPass[0] = false;
	            i = 1; do :: i <= N -> if :: lock[i] == 1 -> lock[i] = 0 :: else fi; i++ :: else -> break od; i = 0;
	            printf("MSC: relay 0 stalls, its locks lapse\n") }
#if RELAYS > 1
	:: d_step { faults < MAXFAULTS && inPass[1] -> faults++; inPass[1] = false;
	            i = 1; do :: i <= N -> if :: lock[i] == 2 -> lock[i] = 0 :: else fi; i++ :: else -> break od; i = 0;
	            printf("MSC: relay 1 stalls, its locks lapse\n") }
#endif
#ifdef LOSSY
	/* Redis loses the next unread entry it acknowledged (a failover to a
	 * replica behind, an fsync that did not happen), after the consumer
	 * has applied something (the check's blind spot is pos 0) */
	:: d_step { lost < 1 && pos > 0 && nempty(stream) -> lost++; stream?_,_;
	            printf("MSC: Redis loses the next entry\n") }
#endif
	:: break   /* no more faults: lets the run end, so Final checks it */
	od
}

#if MAXRESTARTS > 0
/* The recovery: a Redis without the marker gets every published row (and,
 * but for RECOVER_PUBLISHED_ONLY, every claimed row, its claim revoked)
 * requeued as pending in commit order, in one transaction; then the marker. */
active proctype Recovery()
{
	byte i;
end:
	do
	:: d_step { marker == 0 ->
		i = 1;
		do
		:: i <= N ->
			/* the keep rule: a published row the consumer applied stays
			 * published; the others are requeued */
#ifdef KEEP_PAST_POSITION
			if :: st[i] == PUB && i > pos + 1 -> st[i] = PEND :: else fi;
#else
			if :: st[i] == PUB && i > pos -> st[i] = PEND :: else fi;
#endif
#ifndef RECOVER_PUBLISHED_ONLY
			lock[i] = 0;
#endif
			i++
		:: else -> break
		od;
		i = 0;
		printf("MSC: recovery requeues the published rows the consumer has not applied (position %d)\n", pos) };
		d_step { epochs++; marker = epochs; printf("MSC: recovery sets the marker, epoch %d\n", marker) }
	od
}
#endif

/* The operator retries the first abandoned row: pending again. */
active proctype Operator()
{
	byte i;
end:
	do
	:: d_step { nAban > 0 ->
		i = 1;
		do
		:: st[i] == ABAN -> st[i] = PEND; nAban--; printf("MSC: operator retries %d\n", i); break
		:: else -> i++
		od;
		i = 0 }
	od
}

/* When nothing can move: every row committed, published and applied once. */
active proctype Final()
{
	byte i;
	timeout ->
	d_step {
		i = 1;
		do
		:: i <= N -> printf("MSC: at the end %d applied %d times\n", i, applied[i]);
			/* invariant 4: no loss; with a lossy Redis, exactly once where
			 * applied (a lost tail with nothing after it is seen only
			 * when a later message of the key comes; a halt waits for
			 * the operator) */
			assert(applied[i] == 1 || ((halted || lost > 0) && applied[i] == 0)); i++
		:: else -> break
		od;
		i = 0
	}
}

init {
	atomic {
#ifndef WRITER
		committed = N;
#endif
		byte p = 0;
		do
		:: p < RELAYS -> run Relay(p); p++
		:: else -> break
		od
	}
}
