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
// decoded copy (read-your-writes within the batch, as the ABI asks).

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define IMPORT(name) __attribute__((import_module("protean:host/v2"), import_name(name)))
#define EXPORT(name) __attribute__((export_name(name)))

IMPORT("input_length") uint32_t host_input_length(void);
IMPORT("input_read") void host_input_read(void *ptr);
IMPORT("output") uint32_t host_output(const void *ptr, uint32_t len);
IMPORT("error") void host_error(const void *ptr, uint32_t len);
IMPORT("load") uint32_t host_load(const void *req, uint32_t req_len, void *buf, uint32_t buf_cap);
IMPORT("response") uint32_t host_response(void *buf, uint32_t buf_cap);

static const char MANIFEST[] =
    "{\"abi_version\":2,"
    "\"module\":{\"name\":\"client_orders\",\"version\":\"1.0.0\"},"
    "\"messages\":[{\"type\":\"OrderPlaced\",\"kind\":\"event\",\"category\":\"order\","
    "\"fields\":[{\"name\":\"order_id\",\"type\":\"string\",\"required\":true},"
    "{\"name\":\"client_id\",\"type\":\"string\",\"required\":true},"
    "{\"name\":\"total\",\"type\":\"float\",\"required\":true}]}],"
    "\"handlers\":[{\"name\":\"client_orders\",\"kind\":\"projector\",\"category\":\"order\","
    "\"handles\":[\"OrderPlaced\"],\"sequential_by\":\"client_id\",\"documents_by_key\":true}]}";

// The host enforces a call's deadline by instrumenting the module at load
// with periodic calls to WASI's sched_yield, an import every Go module has
// and a C module only has when it uses it (the host cannot add an import
// without renumbering every function). A module without it still runs,
// under the host's slower fallback. So import it, and call it once here.
#include <sched.h>

EXPORT("protean_manifest") int32_t protean_manifest(void) {
    sched_yield();
    return host_output(MANIFEST, sizeof MANIFEST - 1) == 0 ? 0 : 1;
}

// ---- growable byte buffer ----

typedef struct {
    uint8_t *p;
    uint32_t len, cap;
} buf_t;

static void grow(buf_t *b, uint32_t n) {
    if (b->len + n <= b->cap) return;
    uint32_t c = b->cap ? b->cap : 256;
    while (c < b->len + n) c *= 2;
    b->p = realloc(b->p, c);
    if (!b->p) abort();
    b->cap = c;
}
static void put(buf_t *b, const void *p, uint32_t n) {
    grow(b, n);
    memcpy(b->p + b->len, p, n);
    b->len += n;
}
static void put_u8(buf_t *b, uint8_t v) { put(b, &v, 1); }
static void put_u32(buf_t *b, uint32_t v) {  // little-endian, as is wasm
    put(b, &v, 4);
}
static void put_i64(buf_t *b, int64_t v) { put(b, &v, 8); }
static void put_str(buf_t *b, const void *p, uint32_t n) {
    put_u32(b, n);
    put(b, p, n);
}
static void put_cstr(buf_t *b, const char *s) { put(b, s, strlen(s)); }

// ---- reading the v2 encoding ----

typedef struct {
    const uint8_t *p;
    uint32_t len, off;
    int bad;
} rd_t;

static const uint8_t *take(rd_t *r, uint32_t n) {
    if (r->bad || r->len - r->off < n) {
        r->bad = 1;
        return NULL;
    }
    const uint8_t *p = r->p + r->off;
    r->off += n;
    return p;
}
static uint8_t get_u8(rd_t *r) {
    const uint8_t *p = take(r, 1);
    return p ? p[0] : 0;
}
static uint32_t get_u32(rd_t *r) {
    uint32_t v = 0;
    const uint8_t *p = take(r, 4);
    if (p) memcpy(&v, p, 4);
    return v;
}
static int64_t get_i64(rd_t *r) {
    int64_t v = 0;
    const uint8_t *p = take(r, 8);
    if (p) memcpy(&v, p, 8);
    return v;
}
typedef struct {
    const char *p;
    uint32_t n;
} str_t;
static str_t get_str(rd_t *r) {
    uint32_t n = get_u32(r);
    const uint8_t *p = take(r, n);
    str_t s = {(const char *)p, p ? n : 0};
    return s;
}
static int str_eq(str_t s, const char *c) { return s.n == strlen(c) && memcmp(s.p, c, s.n) == 0; }

// ---- a small JSON reader: enough for the payload and the document ----

static const char *ws(const char *p, const char *e) {
    while (p < e && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
    return p;
}

// value_end returns the end of the JSON value at p, or NULL.
static const char *value_end(const char *p, const char *e) {
    if (p >= e) return NULL;
    if (*p == '"') {
        for (p++; p < e; p++) {
            if (*p == '\\') p++;
            else if (*p == '"') return p + 1;
        }
        return NULL;
    }
    if (*p == '{' || *p == '[') {
        int depth = 0;
        for (; p < e; p++) {
            if (*p == '"') {
                const char *q = value_end(p, e);
                if (!q) return NULL;
                p = q - 1;
            } else if (*p == '{' || *p == '[') depth++;
            else if (*p == '}' || *p == ']') {
                if (--depth == 0) return p + 1;
            }
        }
        return NULL;
    }
    const char *s = p;
    while (p < e && (*p == '-' || *p == '+' || *p == '.' || (*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'z') || *p == 'E'))
        p++;
    return p > s ? p : NULL;
}

typedef int (*field_fn)(void *ctx, str_t key, str_t value);

// fields calls fn for each member of the JSON object [p, e). Returns 0 on
// success.
static int fields(const char *p, const char *e, field_fn fn, void *ctx) {
    p = ws(p, e);
    if (p >= e || *p != '{') return -1;
    p = ws(p + 1, e);
    if (p < e && *p == '}') return ws(p + 1, e) == e ? 0 : -1;
    for (;;) {
        if (p >= e || *p != '"') return -1;
        const char *kend = value_end(p, e);
        if (!kend) return -1;
        str_t key = {p + 1, (uint32_t)(kend - p - 2)};
        p = ws(kend, e);
        if (p >= e || *p != ':') return -1;
        p = ws(p + 1, e);
        const char *vend = value_end(p, e);
        if (!vend) return -1;
        str_t val = {p, (uint32_t)(vend - p)};
        if (fn(ctx, key, val)) return -1;
        p = ws(vend, e);
        if (p < e && *p == ',') {
            p = ws(p + 1, e);
            continue;
        }
        if (p < e && *p == '}') return ws(p + 1, e) == e ? 0 : -1;
        return -1;
    }
}

static int is_null(str_t v) { return v.n == 4 && memcmp(v.p, "null", 4) == 0; }

static int hex4(const char *p, uint32_t *out) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= c - '0';
        else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
        else return -1;
    }
    *out = v;
    return 0;
}

static void put_utf8(buf_t *b, uint32_t r) {
    uint8_t u[4];
    if (r < 0x80) put_u8(b, r);
    else if (r < 0x800) {
        u[0] = 0xC0 | (r >> 6), u[1] = 0x80 | (r & 0x3F);
        put(b, u, 2);
    } else if (r < 0x10000) {
        u[0] = 0xE0 | (r >> 12), u[1] = 0x80 | ((r >> 6) & 0x3F), u[2] = 0x80 | (r & 0x3F);
        put(b, u, 3);
    } else {
        u[0] = 0xF0 | (r >> 18), u[1] = 0x80 | ((r >> 12) & 0x3F), u[2] = 0x80 | ((r >> 6) & 0x3F), u[3] = 0x80 | (r & 0x3F);
        put(b, u, 4);
    }
}

// unescape appends the text of the JSON string token v to out (NUL
// terminated). Returns 0 on success.
static int unescape(str_t v, buf_t *out) {
    out->len = 0;
    if (v.n < 2 || v.p[0] != '"' || v.p[v.n - 1] != '"') return -1;
    const char *p = v.p + 1, *e = v.p + v.n - 1;
    while (p < e) {
        char c = *p++;
        if ((unsigned char)c < 0x20) return -1;
        if (c != '\\') {
            put_u8(out, c);
            continue;
        }
        if (p >= e) return -1;
        c = *p++;
        switch (c) {
        case '"': case '\\': case '/': put_u8(out, c); break;
        case 'b': put_u8(out, '\b'); break;
        case 'f': put_u8(out, '\f'); break;
        case 'n': put_u8(out, '\n'); break;
        case 'r': put_u8(out, '\r'); break;
        case 't': put_u8(out, '\t'); break;
        case 'u': {
            uint32_t r, r2;
            if (e - p < 4 || hex4(p, &r)) return -1;
            p += 4;
            if (r >= 0xD800 && r < 0xDC00 && e - p >= 6 && p[0] == '\\' && p[1] == 'u' && !hex4(p + 2, &r2) &&
                r2 >= 0xDC00 && r2 < 0xE000) {
                r = 0x10000 + ((r - 0xD800) << 10) + (r2 - 0xDC00);
                p += 6;
            } else if (r >= 0xD800 && r < 0xE000) {
                r = 0xFFFD;
            }
            put_utf8(out, r);
            break;
        }
        default: return -1;
        }
    }
    put_u8(out, 0);
    out->len--;
    return 0;
}

static const double pow10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                                1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

// number reads a JSON number. Plain decimals of up to 15 digits are read
// by hand (an integer below 2^53 divided by an exact power of ten is
// correctly rounded, as strtod would round it); the rest go to strtod,
// which in wasi-libc computes in software long double.
static int number(str_t v, double *out) {
    if (v.n == 0 || v.n > 64 || !(v.p[0] == '-' || (v.p[0] >= '0' && v.p[0] <= '9'))) return -1;
    {
        uint32_t i = v.p[0] == '-';
        int64_t m = 0;
        int digits = 0, frac = -1;
        for (; i < v.n; i++) {
            char c = v.p[i];
            if (c >= '0' && c <= '9') {
                m = m * 10 + (c - '0');
                digits++;
                if (frac >= 0) frac++;
            } else if (c == '.' && frac < 0) {
                frac = 0;
            } else {
                break;
            }
        }
        if (i == v.n && digits > 0 && digits <= 15 && frac != 0) {
            double d = frac > 0 ? (double)m / pow10[frac] : (double)m;
            *out = v.p[0] == '-' ? -d : d;
            return 0;
        }
    }
    char tmp[65];
    memcpy(tmp, v.p, v.n);
    tmp[v.n] = 0;
    char *end;
    *out = strtod(tmp, &end);
    return *end == 0 ? 0 : -1;
}

// put_json_string appends s as a JSON string token.
static void put_json_string(buf_t *b, const char *s, uint32_t n) {
    static const char hex[] = "0123456789abcdef";
    put_u8(b, '"');
    for (uint32_t i = 0; i < n; i++) {
        unsigned char c = s[i];
        if (c == '"' || c == '\\') {
            put_u8(b, '\\');
            put_u8(b, c);
        } else if (c < 0x20) {
            char u[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
            put(b, u, 6);
        } else put_u8(b, c);
    }
    put_u8(b, '"');
}

// put_double appends the shortest text that reads back as d. Money-like
// values (at most 6 decimals, below 2^53 when scaled) are formatted by
// hand: wasi-libc's printf formats through long double, in software, and
// cost more than the rest of the projector. A value m/10^k equal to d
// reads back as d (the division is correctly rounded, as strtod is), and
// the smallest such k gives the shortest text.
static void put_double(buf_t *b, double d) {
    double p = 1;
    for (int k = 0; k <= 6; k++, p *= 10) {
        double m = d * p;
        if (m > -9007199254740992.0 && m < 9007199254740992.0 && m == (double)(int64_t)m && (double)(int64_t)m / p == d) {
            int64_t n = (int64_t)m;
            char tmp[32];
            int i = sizeof tmp;
            int neg = n < 0 || (n == 0 && 1 / d < 0);
            uint64_t u = n < 0 ? -(uint64_t)n : (uint64_t)n;
            // u's digits, right to left, with the point k digits in and
            // at least one digit before it.
            for (int j = 0;; j++) {
                if (j == k && k > 0) tmp[--i] = '.';
                tmp[--i] = '0' + (char)(u % 10);
                u /= 10;
                if (j >= k && u == 0) break;
            }
            if (neg) tmp[--i] = '-';
            put(b, tmp + i, sizeof tmp - i);
            return;
        }
    }
    char tmp[32];
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*g", prec, d);
        if (strtod(tmp, NULL) == d) break;
    }
    put_cstr(b, tmp);
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
static void fail_result(uint8_t kind, const char *text, uint32_t n) {
    put_u8(&out, 2);
    put_u8(&out, kind);
    put_str(&out, text, n);
}

enum { TRANSIENT = 1, REJECTED = 2, PERMANENT = 3 };

// load_doc loads the client's document from the host into d. Returns 0,
// or the handler error kind, with the message in msg.
static int load_doc(doc_t *d) {
    req.len = 0;
    put_u8(&req, 2);  // projection
    put_str(&req, "client_orders", 13);
    put_str(&req, d->key.p, d->key.len);
    if (answer.cap < 4096) grow(&answer, 4096);
    uint32_t n = host_load(req.p, req.len, answer.p, answer.cap);
    if (n > answer.cap) {
        answer.len = 0;
        grow(&answer, n);
        host_response(answer.p, answer.cap);
    }
    rd_t r = {answer.p, n, 0, 0};
    uint8_t status = get_u8(&r);
    msg.len = 0;
    put_cstr(&msg, "load projection client_orders/");
    put(&msg, d->key.p, d->key.len);
    put_cstr(&msg, ": ");
    if (status != 0) {
        str_t m = get_str(&r);
        put(&msg, m.p, m.n);
        // scope, invalid, not_found never succeed on a retry.
        return (status >= 1 && status <= 3) ? PERMANENT : TRANSIENT;
    }
    uint8_t found = get_u8(&r);
    d->version = get_i64(&r);
    str_t data = get_str(&r);
    if (r.bad) {
        put_cstr(&msg, "bad host answer");
        return TRANSIENT;
    }
    if (found && data.n > 0 && !is_null(data) && fields(data.p, data.p + data.n, doc_field, d)) {
        put_cstr(&msg, "decode record: invalid JSON");
        return PERMANENT;
    }
    return 0;
}

static doc_t *find_doc(const buf_t *client, int *err) {
    for (int i = 0; i < ndocs; i++)
        if (docs[i].key.len == client->len && !memcmp(docs[i].key.p, client->p, client->len)) return &docs[i];
    if (ndocs == capdocs) {
        int c = capdocs ? 2 * capdocs : 16;
        docs = realloc(docs, c * sizeof *docs);
        if (!docs) abort();
        memset(docs + capdocs, 0, (c - capdocs) * sizeof *docs);
        capdocs = c;
    }
    doc_t *d = &docs[ndocs];
    d->key.len = 0;
    put(&d->key, client->p, client->len);
    d->client_id.len = 0;
    put(&d->client_id, client->p, client->len);
    d->version = 0, d->orders = 0, d->total = 0, d->order_ids.len = 0;
    if ((*err = load_doc(d)) != 0) return NULL;
    ndocs++;
    return d;
}

static int handle_one(rd_t *r) {
    get_str(r);  // id
    str_t type = get_str(r);
    get_str(r);  // stream
    get_i64(r), get_i64(r), get_i64(r), get_u32(r);  // positions, time
    str_t data = get_str(r);
    if (get_u8(r)) get_str(r), get_str(r), get_str(r);  // metadata
    if (r->bad) return -1;
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

static int32_t failure(const char *m) {
    host_error(m, strlen(m));
    return 1;
}

EXPORT("protean_handle") int32_t protean_handle(void) {
    uint32_t n = host_input_length();
    uint8_t *in = malloc(n ? n : 1);
    if (!in) return failure("out of memory");
    host_input_read(in);
    rd_t r = {in, n, 0, 0};
    str_t handler = get_str(&r);
    uint32_t count = get_u32(&r);
    if (r.bad) {
        free(in);
        return failure("client_orders: malformed request");
    }
    if (!str_eq(handler, "client_orders")) {
        free(in);
        return failure("module client_orders has no such handler");
    }
    out.len = 0;
    ndocs = 0;
    uint32_t done = 0;
    put_u32(&out, 0);  // the count, patched below
    for (; done < count; done++) {
        int rc = handle_one(&r);
        if (rc < 0) {
            free(in);
            return failure("client_orders: malformed request");
        }
        if (rc > 0) {  // an error result: the batch stops there
            done++;
            break;
        }
    }
    memcpy(out.p, &done, 4);
    free(in);
    return host_output(out.p, out.len) == 0 ? 0 : 1;
}
