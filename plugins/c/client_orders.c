// client_orders in C: the example projector of plugins/examples/client_orders,
// written from abi/v2.md alone (no Extism PDK, no protean kit), against the
// ABI v2 fast path. Per client: the number of orders placed, their total,
// and their ids in the order the projector processed them. Partitioned by
// client_id.
//
// Build (make plugins does, when clang, lld and wasi-libc are installed):
//
//	clang --target=wasm32-wasi --sysroot=/usr -mexec-model=reactor -O2 \
//	    -o client_orders.wasm plugins/c/client_orders.c
//
// The batch's documents are decoded once: the first event of a client
// loads its document from the host, later events of the batch update the
// decoded copy (read-your-writes within the batch, as the ABI asks). What the C
// modules share is in protean.h.

#include "protean.h"

static const char MANIFEST[] =
    "{\"abi_version\":2,"
    "\"module\":{\"name\":\"client_orders\",\"version\":\"1.0.0\"},"
    "\"messages\":[{\"type\":\"OrderPlaced\",\"kind\":\"event\",\"category\":\"order\","
    "\"fields\":[{\"name\":\"order_id\",\"type\":\"string\",\"required\":true},"
    "{\"name\":\"client_id\",\"type\":\"string\",\"required\":true},"
    "{\"name\":\"total\",\"type\":\"float\",\"required\":true}]}],"
    "\"handlers\":[{\"name\":\"client_orders\",\"kind\":\"projector\",\"category\":\"order\","
    "\"handles\":[\"OrderPlaced\"],\"sequential_by\":\"client_id\",\"documents_by_key\":true}]}";

EXPORT("protean_manifest") int32_t protean_manifest(void) {
    sched_yield();  // see protean.h
    return host_output(MANIFEST, sizeof MANIFEST - 1) == 0 ? 0 : 1;
}

// ---- the projector ----

typedef struct {
    buf_t key;        // the event's client_id: the document's id
    buf_t client_id;  // the document's client_id field
    int64_t version;  // the document's version as the next write expects it
    int64_t orders;
    double total;
    buf_t order_ids;  // JSON string tokens joined by ',' (without brackets)
} doc_t;

static doc_t *docs;  // the batch's documents, decoded once
static int ndocs, capdocs;

static buf_t out, scratch, req, answer, msg;

static int doc_field(void *ctx, str_t key, str_t v) {
    doc_t *d = ctx;
    if (is_null(v)) return 0;
    if (key.n == 9 && !memcmp(key.p, "client_id", 9)) return unescape(v, &d->client_id);
    if (key.n == 6 && !memcmp(key.p, "orders", 6)) {
        double n;
        if (number(v, &n)) return -1;
        d->orders = (int64_t)n;
        return 0;
    }
    if (key.n == 5 && !memcmp(key.p, "total", 5)) return number(v, &d->total);
    if (key.n == 9 && !memcmp(key.p, "order_ids", 9)) {
        // Keep the elements' JSON text as it is: each is a string token.
        const char *p = ws(v.p, v.p + v.n), *e = v.p + v.n;
        if (p >= e || *p != '[') return -1;
        d->order_ids.len = 0;
        p = ws(p + 1, e);
        if (p < e && *p == ']') return 0;
        for (;;) {
            const char *q = value_end(p, e);
            if (!q || *p != '"') return -1;
            if (d->order_ids.len) put_u8(&d->order_ids, ',');
            put(&d->order_ids, p, q - p);
            p = ws(q, e);
            if (p < e && *p == ',') {
                p = ws(p + 1, e);
                continue;
            }
            return (p < e && *p == ']') ? 0 : -1;
        }
    }
    return 0;
}

typedef struct {
    str_t order_id;  // the JSON string token
    buf_t client_id; // text
    double total;
    int have_order, have_client;
} placed_t;

static placed_t ev;

static int placed_field(void *ctx, str_t key, str_t v) {
    placed_t *e = ctx;
    if (is_null(v)) return 0;
    if (key.n == 8 && !memcmp(key.p, "order_id", 8)) {
        if (unescape(v, &scratch)) return -1;  // validates it
        e->order_id = v;
        e->have_order = 1;
        return 0;
    }
    if (key.n == 9 && !memcmp(key.p, "client_id", 9)) {
        e->have_client = 1;
        return unescape(v, &e->client_id);
    }
    if (key.n == 5 && !memcmp(key.p, "total", 5)) return number(v, &e->total);
    return 0;
}

// fail_result appends an error result.
static void fail_result(uint8_t kind, const char *text, uint32_t n) { put_error(&out, kind, text, n); }

// find_doc is the client's document from the batch's documents, loaded
// from the host the first time. NULL on a failed load, with its handler
// error kind in *err and the message in msg.
static doc_t *find_doc(const buf_t *client, int *err) {
    for (int i = 0; i < ndocs; i++)
        if (docs[i].key.len == client->len && !memcmp(docs[i].key.p, client->p, client->len)) return &docs[i];
    docs = reserve(docs, ndocs, &capdocs, sizeof *docs);
    doc_t *d = &docs[ndocs];
    d->key.len = 0;
    put(&d->key, client->p, client->len);
    d->client_id.len = 0;
    put(&d->client_id, client->p, client->len);
    d->version = 0, d->orders = 0, d->total = 0, d->order_ids.len = 0;
    if ((*err = load_fields(PROJECTION, "client_orders", d->key.p, d->key.len, &req, &answer, &msg, &d->version, doc_field, d)) != 0)
        return NULL;
    ndocs++;
    return d;
}

static int handle_one(const envelope_t *e) {
    str_t type = e->type, data = e->data;
    if (!str_eq(type, "OrderPlaced")) {
        msg.len = 0;
        put_cstr(&msg, "handler client_orders does not handle ");
        put(&msg, type.p, type.n);
        fail_result(PERMANENT, (const char *)msg.p, msg.len);
        return 1;
    }
    ev.order_id.p = NULL, ev.order_id.n = 0;
    ev.client_id.len = 0, ev.total = 0, ev.have_order = 0, ev.have_client = 0;
    if (fields(data.p, data.p + data.n, placed_field, &ev)) {
        static const char m[] = "decode OrderPlaced: invalid JSON";
        fail_result(PERMANENT, m, sizeof m - 1);
        return 1;
    }
    int err = 0;
    doc_t *d = find_doc(&ev.client_id, &err);
    if (!d) {
        fail_result(err, (const char *)msg.p, msg.len);
        return 1;
    }
    d->orders++;
    d->total += ev.total;
    if (d->order_ids.len) put_u8(&d->order_ids, ',');
    if (ev.have_order) put(&d->order_ids, ev.order_id.p, ev.order_id.n);
    else put_cstr(&d->order_ids, "\"\"");

    // The document's JSON.
    scratch.len = 0;
    put_cstr(&scratch, "{\"client_id\":");
    put_json_string(&scratch, (const char *)d->client_id.p, d->client_id.len);
    put_cstr(&scratch, ",\"orders\":");
    put_double(&scratch, (double)d->orders);
    put_cstr(&scratch, ",\"total\":");
    put_double(&scratch, d->total);
    put_cstr(&scratch, ",\"order_ids\":[");
    put(&scratch, d->order_ids.p, d->order_ids.len);
    put_cstr(&scratch, "]}");

    // result: effects with one projection write
    put_u8(&out, 1);
    put_u32(&out, 0);  // events
    put_u32(&out, 1);  // writes
    put_u8(&out, 2);   // projection
    put_str(&out, "client_orders", 13);
    put_str(&out, d->key.p, d->key.len);
    put_i64(&out, d->version);
    put_str(&out, scratch.p, scratch.len);
    put_u32(&out, 0);  // commands
    d->version++;
    return 0;
}

static void begin(void) { ndocs = 0; }

EXPORT("protean_handle") int32_t protean_handle(void) { return serve("client_orders", &out, begin, handle_one); }
