// orders in C: the example command handler of plugins/examples/orders,
// written from abi/v2.md alone (no Extism PDK, no protean kit), against the
// ABI v2 fast path. It handles PlaceOrder and CancelOrder for the order
// aggregate, emitting OrderPlaced and OrderCancelled on category "order"
// (stream order-{order_id}), with the same manifest, checks, messages and
// JSON as the Go module, so either can replace the other.
//
// Build (make plugins does, when clang, lld and wasi-libc are installed):
//
//	clang --target=wasm32-wasi --sysroot=/usr -mexec-model=reactor -O2 \
//	    -o orders.wasm plugins/c/orders.c
//
// The batch's aggregates are kept once loaded: a later command of the
// batch on the same order sees the earlier one's write (read-your-writes
// within the batch, as the ABI asks). What the C modules share is in
// protean.h.

#include "protean.h"

static const char MANIFEST[] =
    "{\"abi_version\":2,"
    "\"module\":{\"name\":\"orders\",\"version\":\"1.0.0\"},"
    "\"messages\":["
    "{\"type\":\"PlaceOrder\",\"kind\":\"command\",\"category\":\"order\","
    "\"fields\":[{\"name\":\"order_id\",\"type\":\"string\",\"required\":true},"
    "{\"name\":\"client_id\",\"type\":\"string\",\"required\":true},"
    "{\"name\":\"total\",\"type\":\"float\",\"required\":true}]},"
    "{\"type\":\"CancelOrder\",\"kind\":\"command\",\"category\":\"order\","
    "\"fields\":[{\"name\":\"order_id\",\"type\":\"string\",\"required\":true}]},"
    "{\"type\":\"OrderPlaced\",\"kind\":\"event\",\"category\":\"order\","
    "\"fields\":[{\"name\":\"order_id\",\"type\":\"string\",\"required\":true},"
    "{\"name\":\"client_id\",\"type\":\"string\",\"required\":true},"
    "{\"name\":\"total\",\"type\":\"float\",\"required\":true}]},"
    "{\"type\":\"OrderCancelled\",\"kind\":\"event\",\"category\":\"order\","
    "\"fields\":[{\"name\":\"order_id\",\"type\":\"string\",\"required\":true},"
    "{\"name\":\"client_id\",\"type\":\"string\",\"required\":true}]}],"
    "\"handlers\":[{\"name\":\"orders\",\"kind\":\"command_handler\",\"category\":\"order\","
    "\"handles\":[\"PlaceOrder\",\"CancelOrder\"]}]}";

EXPORT("protean_manifest") int32_t protean_manifest(void) {
    sched_yield();  // see protean.h
    return host_output(MANIFEST, sizeof MANIFEST - 1) == 0 ? 0 : 1;
}

// ---- the aggregate ----

typedef struct {
    buf_t id;         // the order's id: the record's id
    int64_t version;  // 0: no such order; what the next write expects
    buf_t client_id;  // text
    double total;
    buf_t status;     // text
} order_t;

static order_t *orders;  // the batch's aggregates, loaded once
static int norders, caporders;

static buf_t out, scratch, req, answer, msg;

static int order_field(void *ctx, str_t key, str_t v) {
    order_t *o = ctx;
    if (is_null(v)) return 0;
    if (key.n == 9 && !memcmp(key.p, "client_id", 9)) return unescape(v, &o->client_id);
    if (key.n == 6 && !memcmp(key.p, "status", 6)) return unescape(v, &o->status);
    if (key.n == 5 && !memcmp(key.p, "total", 5)) return number(v, &o->total);
    return 0;
}

// find_order is the order id from the batch's aggregates, loaded from the
// host the first time. NULL on a failed load, with its handler error kind
// in *err and the message in msg.
static order_t *find_order(const buf_t *id, int *err) {
    for (int i = 0; i < norders; i++)
        if (orders[i].id.len == id->len && !memcmp(orders[i].id.p, id->p, id->len)) return &orders[i];
    orders = reserve(orders, norders, &caporders, sizeof *orders);
    order_t *o = &orders[norders];
    o->id.len = 0;
    put(&o->id, id->p, id->len);
    o->version = 0, o->client_id.len = 0, o->total = 0, o->status.len = 0;
    if ((*err = load_fields(AGGREGATE, "order", id->p, id->len, &req, &answer, &msg, &o->version, order_field, o)) != 0)
        return NULL;
    norders++;
    return o;
}

// ---- the commands ----

typedef struct {
    buf_t order_id, client_id;  // text
    double total;
} command_t;

static command_t cmd;

static int command_field(void *ctx, str_t key, str_t v) {
    command_t *c = ctx;
    if (is_null(v)) return 0;
    if (key.n == 8 && !memcmp(key.p, "order_id", 8)) return unescape(v, &c->order_id);
    if (key.n == 9 && !memcmp(key.p, "client_id", 9)) return unescape(v, &c->client_id);
    if (key.n == 5 && !memcmp(key.p, "total", 5)) return number(v, &c->total);
    return 0;
}

static void fail_result(uint8_t kind, const char *text, uint32_t n) { put_error(&out, kind, text, n); }

// reject appends a rejection whose message is prefix, the text of b, then
// suffix.
static void reject(const char *prefix, const buf_t *b, const char *suffix) {
    msg.len = 0;
    put_cstr(&msg, prefix);
    put(&msg, b->p, b->len);
    put_cstr(&msg, suffix);
    fail_result(REJECTED, (const char *)msg.p, msg.len);
}

// put_order_fields appends the object of o's order_id, client_id and,
// with total, its total, without the closing brace: the start of the
// aggregate's JSON and the whole of its events'.
static void put_order_fields(buf_t *b, const order_t *o, int total) {
    put_cstr(b, "{\"order_id\":");
    put_json_string(b, (const char *)o->id.p, o->id.len);
    put_cstr(b, ",\"client_id\":");
    put_json_string(b, (const char *)o->client_id.p, o->client_id.len);
    if (total) {
        put_cstr(b, ",\"total\":");
        put_double(b, o->total);
    }
}

// put_effects appends a result of one event of type on the order's stream
// (its data o's order_id, client_id and, with total, its total; with the
// expected version when has_expected) and one write of the aggregate, as
// the Go module encodes its Order.
static void put_effects(const order_t *o, const char *type, int total, int has_expected, int64_t expected) {
    put_u8(&out, 1);
    put_u32(&out, 1);  // events
    scratch.len = 0;
    put_cstr(&scratch, "order-");
    put(&scratch, o->id.p, o->id.len);
    put_str(&out, scratch.p, scratch.len);
    put_str(&out, type, strlen(type));
    scratch.len = 0;
    put_order_fields(&scratch, o, total);
    put_u8(&scratch, '}');
    put_str(&out, scratch.p, scratch.len);
    put_u8(&out, has_expected ? 1 : 0);
    put_i64(&out, expected);
    put_str(&out, "", 0);  // the host assigns the id
    put_u32(&out, 1);      // writes
    put_u8(&out, AGGREGATE);
    put_str(&out, "order", 5);
    put_str(&out, o->id.p, o->id.len);
    put_i64(&out, o->version);
    scratch.len = 0;
    put_order_fields(&scratch, o, 1);
    put_cstr(&scratch, ",\"status\":");
    put_json_string(&scratch, (const char *)o->status.p, o->status.len);
    put_u8(&scratch, '}');
    put_str(&out, scratch.p, scratch.len);
    put_u32(&out, 0);  // commands
}

static void place_order(void) {
    if (cmd.order_id.len == 0) {
        static const char m[] = "order_id is required";
        fail_result(REJECTED, m, sizeof m - 1);
        return;
    }
    if (cmd.total < 0) {
        buf_t t = {0};
        put_double(&t, cmd.total);
        reject("total ", &t, " must not be negative");
        free(t.p);
        return;
    }
    int err = 0;
    order_t *o = find_order(&cmd.order_id, &err);
    if (!o) {
        fail_result(err, (const char *)msg.p, msg.len);
        return;
    }
    if (o->version != 0) {
        reject("order ", &cmd.order_id, " already exists");
        return;
    }
    o->client_id.len = 0;
    put(&o->client_id, cmd.client_id.p, cmd.client_id.len);
    o->total = cmd.total;
    o->status.len = 0;
    put_cstr(&o->status, "placed");
    put_effects(o, "OrderPlaced", 1, 1, -1);  // expecting no stream (abi.NoStream)
    o->version++;
}

static void cancel_order(void) {
    int err = 0;
    order_t *o = find_order(&cmd.order_id, &err);
    if (!o) {
        fail_result(err, (const char *)msg.p, msg.len);
        return;
    }
    if (o->version == 0) {
        reject("order ", &cmd.order_id, " does not exist");
        return;
    }
    if (o->status.len == 9 && !memcmp(o->status.p, "cancelled", 9)) {
        reject("order ", &cmd.order_id, " is already cancelled");
        return;
    }
    o->status.len = 0;
    put_cstr(&o->status, "cancelled");
    put_effects(o, "OrderCancelled", 0, 0, 0);
    o->version++;
}

// handle_one handles one message: 0 when it succeeded, 1 when its result
// is an error.
static int handle_one(const envelope_t *e) {
    int place = str_eq(e->type, "PlaceOrder");
    if (!place && !str_eq(e->type, "CancelOrder")) {
        msg.len = 0;
        put_cstr(&msg, "handler orders does not handle ");
        put(&msg, e->type.p, e->type.n);
        fail_result(PERMANENT, (const char *)msg.p, msg.len);
        return 1;
    }
    cmd.order_id.len = 0, cmd.client_id.len = 0, cmd.total = 0;
    if (fields(e->data.p, e->data.p + e->data.n, command_field, &cmd)) {
        msg.len = 0;
        put_cstr(&msg, "decode ");
        put(&msg, e->type.p, e->type.n);
        put_cstr(&msg, ": invalid JSON");
        fail_result(PERMANENT, (const char *)msg.p, msg.len);
        return 1;
    }
    uint32_t before = out.len;
    if (place) place_order();
    else cancel_order();
    return out.p[before] == 2;  // an error result
}

static void begin(void) { norders = 0; }

EXPORT("protean_handle") int32_t protean_handle(void) { return serve("orders", &out, begin, handle_one); }
