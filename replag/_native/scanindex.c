/* replag._scanindex: the per-key work of a scan, in C.
 *
 * A full check hashes every key name and every value it reads (xxh3_64, the same
 * function as the `xxhash` package's xxh3_64_intdigest) and folds them into entry
 * hashes; in Python that is four passes over the batch plus one object per hash. Here
 * it is one loop. Every function has a pure-Python twin in replag/repair/keyspace/native.py
 * (used when this module was not built) and tests/repair/test_native.py checks the two agree
 * bit for bit.
 *
 * Arrays cross as bytes in native byte order (numpy.frombuffer reads them).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define XXH_INLINE_ALL
#include "xxhash.h"

static inline uint64_t mix(uint64_t x) {
    /* splitmix64's finaliser: replag/repair/keyspace/digest.py's _mix */
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

#define STRING_TYPE 0x9E3779B97F4A7C15ULL /* TYPE_CODES["string"] (1) × the golden ratio */
#define EXPIRY_SALT 0x632BE59BD9B4E019ULL
#define NO_EXPIRY 0xFFFFFFFFFFFFFFFFULL

static uint64_t no_expiry_mixed;

static int bytes_list(PyObject *obj, const char *what) {
    if (!PyList_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be a list of bytes, not %.80s", what,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    return 0;
}

static int item_bytes(PyObject *item, const char *what, Py_ssize_t i, const char **data,
                      Py_ssize_t *size) {
    if (!PyBytes_Check(item)) {
        PyErr_Format(PyExc_TypeError, "%s[%zd] must be bytes, not %.80s", what, i,
                     Py_TYPE(item)->tp_name);
        return -1;
    }
    *data = PyBytes_AS_STRING(item);
    *size = PyBytes_GET_SIZE(item);
    return 0;
}

/* hash_each(items: list[bytes]) -> bytes: xxh3_64 of each item, 8 bytes apiece. */
static PyObject *hash_each(PyObject *self, PyObject *items) {
    if (bytes_list(items, "items") < 0) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(items);
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * 8);
    if (out == NULL) return NULL;
    uint64_t *hashes = (uint64_t *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *data;
        Py_ssize_t size;
        if (item_bytes(PyList_GET_ITEM(items, i), "items", i, &data, &size) < 0) {
            Py_DECREF(out);
            return NULL;
        }
        hashes[i] = XXH3_64bits(data, (size_t)size);
    }
    return out;
}

/* string_index(keys: list[bytes], values: list[bytes])
 *   -> (key_hashes, entries, lengths, blob): a batch of strings without expiries, as a
 * ScanIndex holds it (u64 key hashes, u64 entry hashes, u32 name lengths, the names
 * joined). */
static PyObject *string_index(PyObject *self, PyObject *args) {
    PyObject *keys, *values;
    if (!PyArg_ParseTuple(args, "OO:string_index", &keys, &values)) return NULL;
    if (bytes_list(keys, "keys") < 0 || bytes_list(values, "values") < 0) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(keys);
    if (PyList_GET_SIZE(values) != n) {
        PyErr_Format(PyExc_ValueError, "%zd keys but %zd values", n, PyList_GET_SIZE(values));
        return NULL;
    }
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i);
        if (!PyBytes_Check(key)) {
            PyErr_Format(PyExc_TypeError, "keys[%zd] must be bytes, not %.80s", i,
                         Py_TYPE(key)->tp_name);
            return NULL;
        }
        if (PyBytes_GET_SIZE(key) > (Py_ssize_t)UINT32_MAX) {
            PyErr_Format(PyExc_ValueError, "keys[%zd] is longer than 4 GiB", i);
            return NULL;
        }
        total += PyBytes_GET_SIZE(key);
    }
    PyObject *key_hashes = PyBytes_FromStringAndSize(NULL, n * 8);
    PyObject *entries = PyBytes_FromStringAndSize(NULL, n * 8);
    PyObject *lengths = PyBytes_FromStringAndSize(NULL, n * 4);
    PyObject *blob = PyBytes_FromStringAndSize(NULL, total);
    if (!key_hashes || !entries || !lengths || !blob) goto fail;
    uint64_t *kh = (uint64_t *)PyBytes_AS_STRING(key_hashes);
    uint64_t *eh = (uint64_t *)PyBytes_AS_STRING(entries);
    uint32_t *len = (uint32_t *)PyBytes_AS_STRING(lengths);
    char *at = PyBytes_AS_STRING(blob);
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *data;
        Py_ssize_t size;
        if (item_bytes(PyList_GET_ITEM(values, i), "values", i, &data, &size) < 0) goto fail;
        uint64_t digest = XXH3_64bits(data, (size_t)size);
        PyObject *key = PyList_GET_ITEM(keys, i);
        Py_ssize_t key_size = PyBytes_GET_SIZE(key);
        memcpy(at, PyBytes_AS_STRING(key), (size_t)key_size);
        uint64_t key_hash = XXH3_64bits(at, (size_t)key_size);
        at += key_size;
        kh[i] = key_hash;
        eh[i] = mix(key_hash ^ mix(digest ^ STRING_TYPE) ^ no_expiry_mixed);
        len[i] = (uint32_t)key_size;
    }
    return Py_BuildValue("(NNNN)", key_hashes, entries, lengths, blob);
fail:
    Py_XDECREF(key_hashes);
    Py_XDECREF(entries);
    Py_XDECREF(lengths);
    Py_XDECREF(blob);
    return NULL;
}

static int read_length(const unsigned char *lengths, int itemsize, Py_ssize_t i,
                       uint64_t *out) {
    switch (itemsize) {
        case 1: *out = lengths[i]; return 0;
        case 2: { uint16_t v; memcpy(&v, lengths + 2 * i, 2); *out = v; return 0; }
        case 4: { uint32_t v; memcpy(&v, lengths + 4 * i, 4); *out = v; return 0; }
        case 8: { uint64_t v; memcpy(&v, lengths + 8 * i, 8); *out = v; return 0; }
    }
    return -1;
}

/* hash_names(blob, lengths, itemsize) -> bytes: xxh3_64 of each name of a blob of
 * names laid end to end, `lengths` an array of unsigned integers of `itemsize` bytes. */
static PyObject *hash_names(PyObject *self, PyObject *args) {
    Py_buffer blob, lengths;
    int itemsize;
    if (!PyArg_ParseTuple(args, "y*y*i:hash_names", &blob, &lengths, &itemsize)) return NULL;
    PyObject *out = NULL;
    if (itemsize != 1 && itemsize != 2 && itemsize != 4 && itemsize != 8) {
        PyErr_Format(PyExc_ValueError, "itemsize must be 1, 2, 4 or 8, not %d", itemsize);
        goto done;
    }
    if (lengths.len % itemsize) {
        PyErr_Format(PyExc_ValueError, "lengths hold %zd bytes, not a multiple of %d",
                     lengths.len, itemsize);
        goto done;
    }
    Py_ssize_t n = lengths.len / itemsize;
    out = PyBytes_FromStringAndSize(NULL, n * 8);
    if (out == NULL) goto done;
    uint64_t *hashes = (uint64_t *)PyBytes_AS_STRING(out);
    const char *at = (const char *)blob.buf;
    Py_ssize_t left = blob.len;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t size;
        read_length((const unsigned char *)lengths.buf, itemsize, i, &size);
        if (size > (uint64_t)left) {
            PyErr_Format(PyExc_ValueError, "name %zd runs past the blob's end (%zd bytes)", i,
                         blob.len);
            Py_CLEAR(out);
            goto done;
        }
        hashes[i] = XXH3_64bits(at, (size_t)size);
        at += size;
        left -= (Py_ssize_t)size;
    }
    if (left) {
        PyErr_Format(PyExc_ValueError, "the lengths cover %zd of the blob's %zd bytes",
                     blob.len - left, blob.len);
        Py_CLEAR(out);
    }
done:
    PyBuffer_Release(&blob);
    PyBuffer_Release(&lengths);
    return out;
}

/* entries_with_top(arrays: list[buffer of u64], bits, top) -> bytearray: the u64s of all
 * `arrays` whose top `bits` bits are `top`, in order (a slice of their concatenation by
 * value, so a sort needs only that share of the memory). */
static PyObject *entries_with_top(PyObject *self, PyObject *args) {
    PyObject *arrays;
    int bits;
    unsigned long long top;
    if (!PyArg_ParseTuple(args, "OiK:entries_with_top", &arrays, &bits, &top)) return NULL;
    if (!PyList_Check(arrays)) {
        PyErr_SetString(PyExc_TypeError, "arrays must be a list");
        return NULL;
    }
    if (bits < 1 || bits > 16 || top >= (1ULL << bits)) {
        PyErr_Format(PyExc_ValueError, "bits must be 1..16 and top below 2**bits");
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(arrays);
    Py_buffer *views = PyMem_Calloc((size_t)(count ? count : 1), sizeof(Py_buffer));
    if (views == NULL) return PyErr_NoMemory();
    Py_ssize_t got = 0, kept = 0;
    PyObject *out = NULL;
    int shift = 64 - bits;
    for (; got < count; got++) {
        if (PyObject_GetBuffer(PyList_GET_ITEM(arrays, got), &views[got], PyBUF_SIMPLE) < 0)
            goto done;
        if (views[got].len % 8) {
            got++;
            PyErr_Format(PyExc_ValueError, "arrays[%zd] is not of 8-byte integers", got - 1);
            goto done;
        }
        const uint64_t *v = views[got].buf;
        for (Py_ssize_t i = 0; i < views[got].len / 8; i++) kept += (v[i] >> shift) == top;
    }
    out = PyByteArray_FromStringAndSize(NULL, kept * 8);
    if (out == NULL) goto done;
    uint64_t *to = (uint64_t *)PyByteArray_AS_STRING(out);
    for (Py_ssize_t a = 0; a < count; a++) {
        const uint64_t *v = views[a].buf;
        for (Py_ssize_t i = 0; i < views[a].len / 8; i++)
            if ((v[i] >> shift) == top) *to++ = v[i];
    }
done:
    for (Py_ssize_t a = 0; a < got; a++) PyBuffer_Release(&views[a]);
    PyMem_Free(views);
    return out;
}


/* skip_bulks(buf, pos, end, left, max_bytes) -> (pos, left): the reply guard's hot loop
 * (replag/wire/reply_limits.py, `ReplyGuard._steps`, whose Python loop is its twin). From `pos`,
 * inside an aggregate with `left` elements to come, step over whole bulk strings
 * (`$LEN\r\n` + LEN bytes + CRLF, or `$-1\r\n`) while the next one lies whole before
 * `end` and is not the aggregate's last. Stops (leaving the element to the general path)
 * at anything else: another kind, a header cut by `end`, a length over `max_bytes`, below
 * -1 or not plainly decimal. */
static PyObject *skip_bulks(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t pos, end, left, max_bytes;
    if (!PyArg_ParseTuple(args, "y*nnnn", &view, &pos, &end, &left, &max_bytes)) return NULL;
    const unsigned char *b = view.buf;
    if (end > view.len) end = view.len;
    while (pos < end && b[pos] == '$' && left > 1) {
        Py_ssize_t i = pos + 1;
        int negative = 0;
        long long length = 0;
        if (i < end && b[i] == '-') { negative = 1; i++; }
        Py_ssize_t digits = i;
        while (i < end && b[i] >= '0' && b[i] <= '9' && i - digits < 19) {
            length = length * 10 + (b[i] - '0');
            i++;
        }
        if (i == digits || i + 1 >= end || b[i] != '\r' || b[i + 1] != '\n') break;
        if (negative) {
            if (length != 1 || i + 2 >= end) break;
            pos = i + 2;
        } else {
            if (length > max_bytes) break;
            Py_ssize_t after = i + 4 + (Py_ssize_t)length;
            if (after >= end) break;
            pos = after;
        }
        left--;
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("nn", pos, left);
}

static PyMethodDef methods[] = {
    {"hash_each", hash_each, METH_O, "xxh3_64 of each bytes item, as native u64s."},
    {"string_index", string_index, METH_VARARGS,
     "(key_hashes, entries, lengths, blob) of a batch of strings without expiries."},
    {"hash_names", hash_names, METH_VARARGS,
     "xxh3_64 of each name of a blob, given their lengths' bytes and item size."},
    {"entries_with_top", entries_with_top, METH_VARARGS,
     "The u64s of a list of arrays whose top `bits` bits equal `top`."},
    {"skip_bulks", skip_bulks, METH_VARARGS,
     "The reply guard's step over whole bulk strings of an aggregate: (pos, left)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_scanindex", "A scan's per-key hashing, in C.", -1, methods,
};

PyMODINIT_FUNC PyInit__scanindex(void) {
    no_expiry_mixed = mix(NO_EXPIRY + EXPIRY_SALT);
    return PyModule_Create(&module);
}
