// protean.h: what the C example modules share, written from abi/v2.md
// alone: the host functions of ABI v2, a growable buffer, a reader of the
// v2 encoding, a small JSON reader and writer (enough for flat payloads
// and the examples' documents), and a record load. Every function is
// static inline, so a module that leaves one unused compiles cleanly.

#ifndef PROTEAN_H
#define PROTEAN_H

#include <sched.h>
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

// The host enforces a call's deadline by instrumenting the module at load
// with periodic calls to WASI's sched_yield, an import every Go module has
// and a C module only has when it uses it (the host cannot add an import
// without renumbering every function). A module without it still runs,
// under the host's slower fallback. So each module calls it once, in its
// protean_manifest (sched.h above).

// ---- growable byte buffer ----

typedef struct {
    uint8_t *p;
    uint32_t len, cap;
} buf_t;

static inline void grow(buf_t *b, uint32_t n) {
    if (b->len + n <= b->cap) return;
    uint32_t c = b->cap ? b->cap : 256;
    while (c < b->len + n) c *= 2;
    b->p = realloc(b->p, c);
    if (!b->p) abort();
    b->cap = c;
}
static inline void put(buf_t *b, const void *p, uint32_t n) {
    grow(b, n);
    memcpy(b->p + b->len, p, n);
    b->len += n;
}
static inline void put_u8(buf_t *b, uint8_t v) { put(b, &v, 1); }
static inline void put_u32(buf_t *b, uint32_t v) {  // little-endian, as is wasm
    put(b, &v, 4);
}
static inline void put_i64(buf_t *b, int64_t v) { put(b, &v, 8); }
static inline void put_str(buf_t *b, const void *p, uint32_t n) {
    put_u32(b, n);
    put(b, p, n);
}
static inline void put_cstr(buf_t *b, const char *s) { put(b, s, strlen(s)); }

// ---- reading the v2 encoding ----

typedef struct {
    const uint8_t *p;
    uint32_t len, off;
    int bad;
} rd_t;

static inline const uint8_t *take(rd_t *r, uint32_t n) {
    if (r->bad || r->len - r->off < n) {
        r->bad = 1;
        return NULL;
    }
    const uint8_t *p = r->p + r->off;
    r->off += n;
    return p;
}
static inline uint8_t get_u8(rd_t *r) {
    const uint8_t *p = take(r, 1);
    return p ? p[0] : 0;
}
static inline uint32_t get_u32(rd_t *r) {
    uint32_t v = 0;
    const uint8_t *p = take(r, 4);
    if (p) memcpy(&v, p, 4);
    return v;
}
static inline int64_t get_i64(rd_t *r) {
    int64_t v = 0;
    const uint8_t *p = take(r, 8);
    if (p) memcpy(&v, p, 8);
    return v;
}
typedef struct {
    const char *p;
    uint32_t n;
} str_t;
static inline str_t get_str(rd_t *r) {
    uint32_t n = get_u32(r);
    const uint8_t *p = take(r, n);
    str_t s = {(const char *)p, p ? n : 0};
    return s;
}
static inline int str_eq(str_t s, const char *c) { return s.n == strlen(c) && memcmp(s.p, c, s.n) == 0; }

// ---- a small JSON reader: enough for the payload and the document ----

static inline const char *ws(const char *p, const char *e) {
    while (p < e && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
    return p;
}

// value_end returns the end of the JSON value at p, or NULL.
static inline const char *value_end(const char *p, const char *e) {
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
static inline int fields(const char *p, const char *e, field_fn fn, void *ctx) {
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

static inline int is_null(str_t v) { return v.n == 4 && memcmp(v.p, "null", 4) == 0; }

static inline int hex4(const char *p, uint32_t *out) {
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

static inline void put_utf8(buf_t *b, uint32_t r) {
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
static inline int unescape(str_t v, buf_t *out) {
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

// number reads a JSON number. Plain decimals of up to 15 digits are read
// by hand (an integer below 2^53 divided by an exact power of ten is
// correctly rounded, as strtod would round it); the rest go to strtod,
// which in wasi-libc computes in software long double.
static inline int number(str_t v, double *out) {
    static const double pow10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                                   1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
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
static inline void put_json_string(buf_t *b, const char *s, uint32_t n) {
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
static inline void put_double(buf_t *b, double d) {
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


// ---- results and failures ----

// Handler error kinds and record kinds (abi/v2.md's enumerations).
enum { TRANSIENT = 1, REJECTED = 2, PERMANENT = 3 };
enum { AGGREGATE = 1, PROJECTION = 2, PROCESS = 3 };

// put_error appends an error result of kind to b.
static inline void put_error(buf_t *b, uint8_t kind, const char *text, uint32_t n) {
    put_u8(b, 2);
    put_u8(b, kind);
    put_str(b, text, n);
}

// failure fails the whole call with message m (protean_handle's non-zero
// return).
static inline int32_t failure(const char *m) {
    host_error(m, strlen(m));
    return 1;
}

// ---- loading a record ----

typedef struct {
    int found;
    int64_t version;  // what a write of the record must expect
    str_t data;       // the record's JSON (empty when not found); points into the answer buffer
    str_t message;    // the host's message when the status is not 0
} loaded_t;

// load_record asks the host for the record kind/type/id, using req and
// answer as buffers (answer keeps the bytes the result points into). It
// returns the host's status (0 ok; 1 scope, 2 invalid, 3 not_found, 4
// conflict, 5 transient), or -1 for an answer it cannot read.
static inline int load_record(uint8_t kind, const char *type, uint32_t type_len, const void *id, uint32_t id_len,
                              buf_t *req, buf_t *answer, loaded_t *out) {
    req->len = 0;
    put_u8(req, kind);
    put_str(req, type, type_len);
    put_str(req, id, id_len);
    if (answer->cap < 4096) grow(answer, 4096);
    uint32_t n = host_load(req->p, req->len, answer->p, answer->cap);
    if (n > answer->cap) {
        answer->len = 0;
        grow(answer, n);
        host_response(answer->p, answer->cap);
    }
    rd_t r = {answer->p, n, 0, 0};
    uint8_t status = get_u8(&r);
    memset(out, 0, sizeof *out);
    if (status != 0) {
        out->message = get_str(&r);
        return r.bad ? -1 : status;
    }
    out->found = get_u8(&r);
    out->version = get_i64(&r);
    out->data = get_str(&r);
    return r.bad ? -1 : 0;
}

// status_kind is the handler error kind for a failed load's status: scope,
// invalid and not_found never succeed on a retry.
static inline int status_kind(int status) { return (status >= 1 && status <= 3) ? PERMANENT : TRANSIENT; }

// load_fields loads the record kind/type/id (type NUL-terminated) and
// hands each member of its JSON to fn with ctx (nothing when it is not
// found), setting *version to what a write of it must expect. It returns
// 0, or the handler error kind with the failure in msg ("load aggregate
// order/o-1: ..."). req and answer are its buffers.
static inline int load_fields(uint8_t kind, const char *type, const void *id, uint32_t id_len, buf_t *req,
                              buf_t *answer, buf_t *msg, int64_t *version, field_fn fn, void *ctx) {
    static const char *const kinds[] = {"record", "aggregate", "projection", "process"};
    loaded_t l;
    int status = load_record(kind, type, strlen(type), id, id_len, req, answer, &l);
    msg->len = 0;
    put_cstr(msg, "load ");
    put_cstr(msg, kinds[kind <= PROCESS ? kind : 0]);
    put_u8(msg, ' ');
    put_cstr(msg, type);
    put_u8(msg, '/');
    put(msg, id, id_len);
    put_cstr(msg, ": ");
    if (status < 0) {
        put_cstr(msg, "bad host answer");
        return TRANSIENT;
    }
    if (status != 0) {
        put(msg, l.message.p, l.message.n);
        return status_kind(status);
    }
    *version = l.version;
    if (l.found && l.data.n > 0 && !is_null(l.data) && fields(l.data.p, l.data.p + l.data.n, fn, ctx)) {
        put_cstr(msg, "decode record: invalid JSON");
        return PERMANENT;
    }
    return 0;
}

// reserve returns p, an array of *cap elements of size bytes of which n
// are used, with room for one more: grown (doubled, from 16) and the new
// elements zeroed when it is full.
static inline void *reserve(void *p, int n, int *cap, size_t size) {
    if (n < *cap) return p;
    int c = *cap ? 2 * *cap : 16;
    p = realloc(p, (size_t)c * size);
    if (!p) abort();
    memset((char *)p + (size_t)*cap * size, 0, (size_t)(c - *cap) * size);
    *cap = c;
    return p;
}

// ---- the request ----

// envelope_t is one message of the request; its strings point into the
// request.
typedef struct {
    str_t id, type, stream, data;
    int64_t position, global_position;
} envelope_t;

// get_envelope reads the next message of r (its time and metadata are
// skipped). Returns -1 for a request it cannot read.
static inline int get_envelope(rd_t *r, envelope_t *e) {
    e->id = get_str(r);
    e->type = get_str(r);
    e->stream = get_str(r);
    e->position = get_i64(r);
    e->global_position = get_i64(r);
    get_i64(r), get_u32(r);  // time
    e->data = get_str(r);
    if (get_u8(r)) get_str(r), get_str(r), get_str(r);  // metadata
    return r->bad ? -1 : 0;
}

// serve is a protean_handle for the handler named handler: it reads the
// request, calls begin once, then one for each message in turn (one
// appends the message's result to out and returns 0, 1 for an error
// result, after which the batch stops, or -1 for a request it cannot
// read), and sets out, the count first, as the output.
static inline int32_t serve(const char *handler, buf_t *out, void (*begin)(void), int (*one)(const envelope_t *)) {
    uint32_t n = host_input_length();
    uint8_t *in = malloc(n ? n : 1);
    if (!in) return failure("out of memory");
    host_input_read(in);
    rd_t r = {in, n, 0, 0};
    str_t name = get_str(&r);
    uint32_t count = get_u32(&r);
    int32_t rc = 0;
    if (r.bad) {
        rc = failure("malformed request");
    } else if (!str_eq(name, handler)) {
        rc = failure("no such handler");
    } else {
        out->len = 0;
        begin();
        uint32_t done = 0;
        put_u32(out, 0);  // the count, patched below
        for (; done < count; done++) {
            envelope_t e;
            int res = get_envelope(&r, &e) ? -1 : one(&e);
            if (res < 0) {
                rc = failure("malformed request");
                break;
            }
            if (res > 0) {  // an error result: the batch stops there
                done++;
                break;
            }
        }
        if (rc == 0) {
            memcpy(out->p, &done, 4);
            rc = host_output(out->p, out->len) == 0 ? 0 : 1;
        }
    }
    free(in);
    return rc;
}

#endif
