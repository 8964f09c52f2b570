/* tokenizer.c — see tokenizer.h. */
#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "unicode_tables.h"

enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER_DEFINED = 4, TT_UNUSED = 5, TT_BYTE = 6 };

struct tokenizer {
    int32_t n_vocab;
    char *text;            /* token strings as stored (byte-level unicode), NUL-separated */
    uint64_t *text_off;    /* n_vocab + 1 offsets into text (entry i ends at text_off[i+1]-1) */
    char *bytes;           /* decoded raw bytes of every token */
    uint64_t *bytes_off;   /* n_vocab + 1 */
    uint8_t *special;      /* 1 for CONTROL / USER_DEFINED */
    int32_t *str_table;    /* open addressing: token ids by string hash, -1 empty */
    uint64_t str_cap;
    uint64_t *pair_key;    /* open addressing: (a << 32 | b) + 1, 0 empty */
    int32_t *pair_rank, *pair_out;
    uint64_t pair_cap;
    int32_t byte_token[256];
    int32_t *specials;     /* special ids, longest text first (for parse_special) */
    int32_t n_specials;
    int32_t bos, eos;
};

/* ---------------------------------------------------------------- utilities */

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

static uint64_t hash_u64(uint64_t x) {
    x ^= x >> 33; x *= 0xff51afd7ed558ccdull; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull; x ^= x >> 33;
    return x;
}

static uint64_t pow2_at_least(uint64_t n) {
    uint64_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

static const char *tok_text(const tokenizer *t, int32_t id, size_t *len) {
    *len = (size_t)(t->text_off[id + 1] - t->text_off[id] - 1);
    return t->text + t->text_off[id];
}

static int32_t find_str(const tokenizer *t, const char *s, size_t n) {
    uint64_t mask = t->str_cap - 1;
    for (uint64_t i = hash_bytes(s, n) & mask;; i = (i + 1) & mask) {
        int32_t id = t->str_table[i];
        size_t len;
        if (id < 0) return -1;
        const char *p = tok_text(t, id, &len);
        if (len == n && memcmp(p, s, n) == 0) return id;
    }
}

/* UTF-8 decode one codepoint at s[0..n); invalid or truncated sequences give the single
   byte as a codepoint in [0x80, 0xFF] with *adv = 1 (never reads past n). */
static uint32_t utf8_next(const uint8_t *s, size_t n, size_t *adv) {
    uint32_t c = s[0];
    size_t need = 0;
    if (c < 0x80) { *adv = 1; return c; }
    if ((c & 0xE0) == 0xC0) { need = 1; c &= 0x1F; }
    else if ((c & 0xF0) == 0xE0) { need = 2; c &= 0x0F; }
    else if ((c & 0xF8) == 0xF0) { need = 3; c &= 0x07; }
    else { *adv = 1; return s[0]; }
    if (need >= n) { *adv = 1; return s[0]; }
    for (size_t i = 1; i <= need; i++) {
        if ((s[i] & 0xC0) != 0x80) { *adv = 1; return s[0]; }
        c = (c << 6) | (s[i] & 0x3F);
    }
    *adv = need + 1;
    return c;
}

static size_t utf8_put(uint32_t c, char *o) {
    if (c < 0x80) { o[0] = (char)c; return 1; }
    if (c < 0x800) { o[0] = (char)(0xC0 | (c >> 6)); o[1] = (char)(0x80 | (c & 0x3F)); return 2; }
    if (c < 0x10000) {
        o[0] = (char)(0xE0 | (c >> 12)); o[1] = (char)(0x80 | ((c >> 6) & 0x3F));
        o[2] = (char)(0x80 | (c & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (c >> 18)); o[1] = (char)(0x80 | ((c >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((c >> 6) & 0x3F)); o[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

/* GPT-2 bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68 bytes
   to U+0100.. in byte order. */
static void byte_unicode_maps(uint32_t b2u[256], int32_t u2b[512]) {
    uint32_t next = 256;
    for (int i = 0; i < 512; i++) u2b[i] = -1;
    for (uint32_t b = 0; b < 256; b++) {
        int keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        b2u[b] = keep ? b : next++;
        u2b[b2u[b]] = (int32_t)b;
    }
}

/* ---------------------------------------------------------------- categories */

enum { CAT_OTHER = 0, CAT_LETTER = 1, CAT_NUMBER = 2, CAT_SPACE = 3 };

static int in_ranges(uint32_t c, const uint32_t (*r)[2], size_t n) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (c < r[mid][0]) hi = mid;
        else if (c > r[mid][1]) lo = mid + 1;
        else return 1;
    }
    return 0;
}

static int cat_of(uint32_t c) {
    /* \s as in llama.cpp's unicode tables (White_Space property) */
    if ((c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
        (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
        c == 0x205F || c == 0x3000)
        return CAT_SPACE;
    if (c < 0x80) {
        if ((c | 32) >= 'a' && (c | 32) <= 'z') return CAT_LETTER;
        if (c >= '0' && c <= '9') return CAT_NUMBER;
        return CAT_OTHER;
    }
    if (in_ranges(c, unicode_letter_ranges, sizeof unicode_letter_ranges / sizeof unicode_letter_ranges[0]))
        return CAT_LETTER;
    if (in_ranges(c, unicode_number_ranges, sizeof unicode_number_ranges / sizeof unicode_number_ranges[0]))
        return CAT_NUMBER;
    return CAT_OTHER;
}

/* ---------------------------------------------------------------- load */

static int set_err(char *err, size_t errlen, const char *msg, long long a) {
    if (err && errlen) snprintf(err, errlen, msg, a);
    return -1;
}

void tokenizer_free(tokenizer *t) {
    if (!t) return;
    free(t->text); free(t->text_off); free(t->bytes); free(t->bytes_off); free(t->special);
    free(t->str_table); free(t->pair_key); free(t->pair_rank); free(t->pair_out); free(t->specials);
    free(t);
}

static int cmp_special_len_desc(const void *a, const void *b, const tokenizer *t) {
    size_t la, lb;
    tok_text(t, *(const int32_t *)a, &la);
    tok_text(t, *(const int32_t *)b, &lb);
    return la < lb ? 1 : la > lb ? -1 : 0;
}

static int load(tokenizer *t, const gguf_file *f, char *err, size_t errlen) {
    gguf_str model;
    uint32_t b2u[256];
    int32_t u2b[512];
    if (gguf_get_str(f, "tokenizer.ggml.model", &model) || !gguf_str_eq(model, "gpt2"))
        return set_err(err, errlen, "tokenizer: tokenizer.ggml.model must be \"gpt2\" (byte-level BPE)%.0lld", 0);
    const gguf_kv *toks = gguf_find_kv(f, "tokenizer.ggml.tokens");
    const gguf_kv *types = gguf_find_kv(f, "tokenizer.ggml.token_type");
    const gguf_kv *merges = gguf_find_kv(f, "tokenizer.ggml.merges");
    if (!toks || toks->type != GGUF_VT_ARRAY || toks->v.arr.elem_type != GGUF_VT_STRING)
        return set_err(err, errlen, "tokenizer: tokenizer.ggml.tokens missing or not a string array%.0lld", 0);
    if (!merges || merges->type != GGUF_VT_ARRAY || merges->v.arr.elem_type != GGUF_VT_STRING)
        return set_err(err, errlen, "tokenizer: tokenizer.ggml.merges missing or not a string array%.0lld", 0);
    if (toks->v.arr.n == 0 || toks->v.arr.n > (1u << 24))
        return set_err(err, errlen, "tokenizer: vocabulary size %lld; expected 1..16M", (long long)toks->v.arr.n);
    if (types && (types->type != GGUF_VT_ARRAY || types->v.arr.elem_type != GGUF_VT_INT32 ||
                  types->v.arr.n != toks->v.arr.n))
        return set_err(err, errlen, "tokenizer: tokenizer.ggml.token_type must be an INT32 array of %lld entries",
                       (long long)toks->v.arr.n);
    int32_t n = (int32_t)toks->v.arr.n;
    t->n_vocab = n;

    /* token strings, NUL-terminated copies */
    uint64_t total = 0;
    for (int32_t i = 0; i < n; i++) total += toks->v.arr.strs[i].len + 1;
    t->text = malloc(total);
    t->text_off = malloc(((size_t)n + 1) * sizeof(uint64_t));
    t->special = calloc((size_t)n, 1);
    t->str_cap = pow2_at_least((uint64_t)n * 2);
    t->str_table = malloc(t->str_cap * sizeof(int32_t));
    if (!t->text || !t->text_off || !t->special || !t->str_table)
        return set_err(err, errlen, "tokenizer: out of memory%.0lld", 0);
    uint64_t off = 0;
    for (int32_t i = 0; i < n; i++) {
        gguf_str s = toks->v.arr.strs[i];
        t->text_off[i] = off;
        memcpy(t->text + off, s.ptr, (size_t)s.len);
        off += s.len;
        t->text[off++] = 0;
    }
    t->text_off[n] = off;
    memset(t->str_table, 0xFF, t->str_cap * sizeof(int32_t));
    for (int32_t i = 0; i < n; i++) {
        size_t len;
        const char *s = tok_text(t, i, &len);
        if (find_str(t, s, len) >= 0) continue; /* duplicate string: first id wins */
        uint64_t mask = t->str_cap - 1, h = hash_bytes(s, len) & mask;
        while (t->str_table[h] >= 0) h = (h + 1) & mask;
        t->str_table[h] = i;
    }

    /* special tokens */
    t->specials = malloc((size_t)n * sizeof(int32_t));
    if (!t->specials) return set_err(err, errlen, "tokenizer: out of memory%.0lld", 0);
    for (int32_t i = 0; types && i < n; i++) {
        int32_t ty;
        memcpy(&ty, types->v.arr.data + 4 * (size_t)i, 4);
        size_t len;
        tok_text(t, i, &len);
        if ((ty == TT_CONTROL || ty == TT_USER_DEFINED) && len > 0) {
            t->special[i] = 1;
            t->specials[t->n_specials++] = i;
        }
    }
    /* insertion sort, longest first, so "<|im_start|>" wins over a shorter prefix */
    for (int32_t i = 1; i < t->n_specials; i++)
        for (int32_t j = i; j > 0 && cmp_special_len_desc(&t->specials[j - 1], &t->specials[j], t) > 0; j--) {
            int32_t x = t->specials[j]; t->specials[j] = t->specials[j - 1]; t->specials[j - 1] = x;
        }

    /* decoded bytes of each token */
    byte_unicode_maps(b2u, u2b);
    t->bytes = malloc(total);
    t->bytes_off = malloc(((size_t)n + 1) * sizeof(uint64_t));
    if (!t->bytes || !t->bytes_off) return set_err(err, errlen, "tokenizer: out of memory%.0lld", 0);
    off = 0;
    for (int32_t i = 0; i < n; i++) {
        size_t len, p = 0, adv;
        const char *s = tok_text(t, i, &len);
        t->bytes_off[i] = off;
        if (t->special[i]) {
            memcpy(t->bytes + off, s, len);
            off += len;
            continue;
        }
        while (p < len) { /* each codepoint is one byte; anything else is kept as its UTF-8 */
            uint32_t c = utf8_next((const uint8_t *)s + p, len - p, &adv);
            if (c < 512 && u2b[c] >= 0 && adv > 0) t->bytes[off++] = (char)u2b[c];
            else { memcpy(t->bytes + off, s + p, adv); off += adv; }
            p += adv;
        }
    }
    t->bytes_off[n] = off;

    /* byte -> initial token. SmolLM2's vocabulary lacks 21 bytes (0xC0 0xC1 0xF5..0xFF never
       occur in UTF-8, 0xF1 0xF2 lead only planes 4..11, plus 6 control characters): -1. */
    int n_bytes = 0;
    for (int b = 0; b < 256; b++) {
        char u[4];
        size_t l = utf8_put(b2u[b], u);
        t->byte_token[b] = find_str(t, u, l);
        n_bytes += t->byte_token[b] >= 0;
    }
    if (n_bytes < 128)
        return set_err(err, errlen, "tokenizer: only %lld of 256 byte tokens exist (not a byte-level BPE vocabulary)", n_bytes);

    /* merges: "A B" -> pair (id(A), id(B)) with rank r and result id(A B) */
    uint64_t nm = merges->v.arr.n;
    if (nm > (1u << 24)) return set_err(err, errlen, "tokenizer: %lld merges is too many", (long long)nm);
    t->pair_cap = pow2_at_least(nm * 2 + 1);
    t->pair_key = calloc(t->pair_cap, sizeof(uint64_t));
    t->pair_rank = malloc(t->pair_cap * sizeof(int32_t));
    t->pair_out = malloc(t->pair_cap * sizeof(int32_t));
    if (!t->pair_key || !t->pair_rank || !t->pair_out) return set_err(err, errlen, "tokenizer: out of memory%.0lld", 0);
    char buf[1024];
    for (uint64_t r = 0; r < nm; r++) {
        gguf_str s = merges->v.arr.strs[r];
        size_t sp = 1; /* split at the first space after position 0 (as llama.cpp) */
        while (sp < s.len && s.ptr[sp] != ' ') sp++;
        if (s.len < 3 || sp >= s.len - 1 || s.len >= sizeof buf)
            return set_err(err, errlen, "tokenizer: merge #%lld is not \"A B\"", (long long)r);
        int32_t a = find_str(t, s.ptr, sp);
        int32_t b = find_str(t, s.ptr + sp + 1, (size_t)s.len - sp - 1);
        memcpy(buf, s.ptr, sp);
        memcpy(buf + sp, s.ptr + sp + 1, (size_t)s.len - sp - 1);
        int32_t c = find_str(t, buf, (size_t)s.len - 1);
        if (a < 0 || b < 0 || c < 0)
            return set_err(err, errlen, "tokenizer: merge #%lld names a token that is not in the vocabulary", (long long)r);
        uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
        uint64_t mask = t->pair_cap - 1, h = hash_u64(key) & mask;
        while (t->pair_key[h] && t->pair_key[h] != key) h = (h + 1) & mask;
        if (t->pair_key[h]) continue; /* repeated merge: the lower rank stays */
        t->pair_key[h] = key;
        t->pair_rank[h] = (int32_t)r;
        t->pair_out[h] = c;
    }

    uint32_t id;
    t->bos = (gguf_get_u32(f, "tokenizer.ggml.bos_token_id", &id) == 0 && id < (uint32_t)n) ? (int32_t)id : -1;
    t->eos = (gguf_get_u32(f, "tokenizer.ggml.eos_token_id", &id) == 0 && id < (uint32_t)n) ? (int32_t)id : -1;
    return 0;
}

tokenizer *tokenizer_load(const gguf_file *f, char *err, size_t errlen) {
    tokenizer *t = calloc(1, sizeof *t);
    if (!t) { set_err(err, errlen, "tokenizer: out of memory%.0lld", 0); return NULL; }
    if (load(t, f, err, errlen) != 0) { tokenizer_free(t); return NULL; }
    return t;
}

int32_t tokenizer_vocab_size(const tokenizer *t) { return t->n_vocab; }
int32_t tokenizer_bos(const tokenizer *t) { return t->bos; }
int32_t tokenizer_eos(const tokenizer *t) { return t->eos; }
int tokenizer_is_special(const tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && t->special[id];
}
int32_t tokenizer_find(const tokenizer *t, const char *s) { return find_str(t, s, strlen(s)); }

const char *tokenizer_token_bytes(const tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab) return NULL;
    *len = (size_t)(t->bytes_off[id + 1] - t->bytes_off[id]);
    return t->bytes + t->bytes_off[id];
}

/* ---------------------------------------------------------------- encode */

typedef struct ids_buf { int32_t *v; size_t n, cap; int oom; } ids_buf;

static void push(ids_buf *b, int32_t id) {
    if (b->oom) return;
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        int32_t *v = realloc(b->v, cap * sizeof(int32_t));
        if (!v) { b->oom = 1; return; }
        b->v = v;
        b->cap = cap;
    }
    b->v[b->n++] = id;
}

static int pair_lookup(const tokenizer *t, int32_t a, int32_t b, int32_t *rank, int32_t *out) {
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    uint64_t mask = t->pair_cap - 1;
    for (uint64_t h = hash_u64(key) & mask; t->pair_key[h]; h = (h + 1) & mask)
        if (t->pair_key[h] == key) { *rank = t->pair_rank[h]; *out = t->pair_out[h]; return 1; }
    return 0;
}

/* BPE of one pre-token (raw bytes). sym is scratch of at least n entries. */
static void bpe_word(const tokenizer *t, const uint8_t *s, size_t n, int32_t *sym, ids_buf *out) {
    size_t m = 0;
    for (size_t i = 0; i < n; i++) /* bytes without a token are dropped, as llama.cpp and HF do */
        if (t->byte_token[s[i]] >= 0) sym[m++] = t->byte_token[s[i]];
    while (m > 1) {
        int32_t best_rank = INT32_MAX, best_out = -1, r, o;
        size_t best_i = 0;
        for (size_t i = 0; i + 1 < m; i++)
            if (pair_lookup(t, sym[i], sym[i + 1], &r, &o) && r < best_rank) {
                best_rank = r; best_out = o; best_i = i;
            }
        if (best_out < 0) break;
        sym[best_i] = best_out;
        memmove(sym + best_i + 1, sym + best_i + 2, (m - best_i - 2) * sizeof(int32_t));
        m--;
    }
    for (size_t i = 0; i < m; i++) push(out, sym[i]);
}

/* GPT-2 regex split of codepoints cp[0..n) (byte offsets bo[0..n]); BPE each match. */
static void gpt2_split(const tokenizer *t, const uint8_t *text, const uint32_t *cp, const uint8_t *cat,
                       const size_t *bo, size_t n, int32_t *sym, ids_buf *out) {
    size_t pos = 0;
    while (pos < n) {
        size_t start = pos;
        uint32_t c = cp[pos];
#define CAT(i) ((i) < n ? (int)cat[i] : -1)
        if (c == '\'' && pos + 1 < n) {
            uint32_t c1 = cp[pos + 1];
            if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') { pos += 2; goto emit; }
            if (pos + 2 < n) {
                uint32_t c2 = cp[pos + 2];
                if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) {
                    pos += 3;
                    goto emit;
                }
            }
        }
        {
            int c2 = (c == ' ') ? CAT(pos + 1) : CAT(pos);
            if (c2 == CAT_LETTER || c2 == CAT_NUMBER) {
                pos += (c == ' ');
                while (CAT(pos) == c2) pos++;
                goto emit;
            }
            if (c2 == CAT_OTHER) {
                pos += (c == ' ');
                while (CAT(pos) == CAT_OTHER) pos++;
                goto emit;
            }
            size_t ws = 0;
            while (CAT(pos + ws) == CAT_SPACE) ws++;
            if (ws > 1 && pos + ws < n) { pos += ws - 1; goto emit; } /* \s+(?!\S) */
            if (ws > 0) { pos += ws; goto emit; }                      /* \s+ */
            pos++;
        }
#undef CAT
    emit:
        bpe_word(t, text + bo[start], bo[pos] - bo[start], sym, out);
    }
}

/* Digits split (each \p{N} its own piece), then the GPT-2 split of every piece. */
static void encode_plain(const tokenizer *t, const uint8_t *s, size_t len, ids_buf *out) {
    if (len == 0) return;
    uint32_t *cp = malloc(len * sizeof(uint32_t));
    uint8_t *cat = malloc(len);
    size_t *bo = malloc((len + 1) * sizeof(size_t));
    int32_t *sym = malloc(len * sizeof(int32_t));
    if (!cp || !cat || !bo || !sym) { out->oom = 1; goto done; }
    size_t n = 0, p = 0, adv;
    while (p < len) {
        bo[n] = p;
        cp[n] = utf8_next(s + p, len - p, &adv);
        /* a lone invalid byte is "other", not the Latin-1 letter it would alias */
        cat[n] = (uint8_t)(adv == 1 && s[p] >= 0x80 ? CAT_OTHER : cat_of(cp[n]));
        n++;
        p += adv;
    }
    bo[n] = len;
    size_t i = 0;
    while (i < n) {
        if (cat[i] == CAT_NUMBER) {
            gpt2_split(t, s, cp + i, cat + i, bo + i, 1, sym, out);
            i++;
            continue;
        }
        size_t j = i;
        while (j < n && cat[j] != CAT_NUMBER) j++;
        gpt2_split(t, s, cp + i, cat + i, bo + i, j - i, sym, out);
        i = j;
    }
done:
    free(cp); free(cat); free(bo); free(sym);
}

int tokenizer_encode(const tokenizer *t, const char *text, size_t len, int parse_special,
                     int32_t **out, size_t *n_out) {
    ids_buf b = {0};
    const uint8_t *s = (const uint8_t *)text;
    size_t seg = 0, p = 0;
    while (parse_special && p < len) {
        int32_t hit = -1;
        size_t hl = 0;
        for (int32_t k = 0; k < t->n_specials; k++) {
            size_t l;
            const char *st = tok_text(t, t->specials[k], &l);
            if ((uint8_t)st[0] == s[p] && l <= len - p && memcmp(s + p, st, l) == 0) {
                hit = t->specials[k];
                hl = l;
                break;
            }
        }
        if (hit < 0) { p++; continue; }
        encode_plain(t, s + seg, p - seg, &b);
        push(&b, hit);
        p += hl;
        seg = p;
    }
    encode_plain(t, s + seg, len - seg, &b);
    if (b.oom) { free(b.v); *out = NULL; *n_out = 0; return -1; }
    *out = b.v;
    *n_out = b.n;
    return 0;
}

int tokenizer_decode(const tokenizer *t, const int32_t *ids, size_t n, char **out, size_t *len) {
    size_t total = 0, l;
    for (size_t i = 0; i < n; i++) {
        if (!tokenizer_token_bytes(t, ids[i], &l)) return -1;
        total += l;
    }
    char *o = malloc(total + 1);
    if (!o) return -1;
    total = 0;
    for (size_t i = 0; i < n; i++) {
        const char *p = tokenizer_token_bytes(t, ids[i], &l);
        memcpy(o + total, p, l);
        total += l;
    }
    o[total] = 0;
    *out = o;
    *len = total;
    return 0;
}
