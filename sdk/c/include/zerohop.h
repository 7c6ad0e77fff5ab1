/*
 * zerohop.h: the C SDK of zerohop functions.
 *
 * A function is a program that calls zh_run() with its handler. The handler sees the
 * request's body in place in shared memory (zh_body), may change it there, replace it
 * (zh_set_body) or append to it (zh_extend), call other functions (zh_call), use the
 * chain's state (zh_state_get/put/delete), read the route's parameters, the query and
 * cookies (zh_param, zh_query, zh_cookie), set the answer's status and headers
 * (zh_set_status, zh_add_response_header), and returns where the request goes next:
 * ZH_CONTINUE, ZH_REPLY, zh_forward(req, "name") or zh_fail(req, status, "message").
 *
 *     #include <zerohop.h>
 *     #include <ctype.h>
 *
 *     static zh_next upper(zh_request *req, void *user) {
 *         size_t len;
 *         uint8_t *body = zh_body(req, &len);
 *         for (size_t i = 0; i < len; i++) body[i] = (uint8_t)toupper(body[i]);
 *         return ZH_CONTINUE;
 *     }
 *
 *     int main(void) { zh_run(upper, NULL); }
 *
 * Build: cc upper.c $(pkg-config --cflags --libs zerohop) (see docs/sdk-c.md).
 *
 * Pointers into the request (body, headers, answers) are valid until the handler returns
 * (answers: until zh_answer_free). With `concurrency` above 1 in the chain spec the handler
 * runs on several threads at once, with the same `user` pointer.
 */

#ifndef ZEROHOP_H
#define ZEROHOP_H

/* Generated from crates/zerohop-c by cbindgen (ZEROHOP_BLESS=1 cargo test -p zerohop-c --test header); do not edit. */

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#define ZH_NORETURN __attribute__((noreturn))

// Where a request goes after the handler.
typedef enum zh_next {
  // On along the route (or back to the client after the route's last function).
  ZH_CONTINUE = 0,
  // Straight back to the client, skipping the rest of the route.
  ZH_REPLY = 1,
  // To the function named by the last zh_forward (returned by it).
  ZH_FORWARD = 2,
  // An error answer, as set by the last zh_fail (returned by it).
  ZH_FAIL = 3,
} zh_next;

// The answer of a call: a status (200 when the callee gave an output) and a body (the
// output, or the error's message). Free with zh_answer_free.
typedef struct zh_answer zh_answer;

// One request, valid during one call of the handler.
typedef struct zh_request zh_request;

// A handler: called once per request with the request and the `user` pointer given to
// zh_run.
typedef enum zh_next (*zh_handler)(struct zh_request *req, void *user);

// One call of zh_call_all.
typedef struct zh_call_spec {
  // The function to call (NUL-terminated).
  const char *function;
  // Its input.
  const void *input;
  // The input's length.
  size_t len;
} zh_call_spec;

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

// Runs `handler` as this process's function until the agent stops it; never returns. A
// program not started by the agent exits with status 2 and says why on standard error.
//
// # Safety
//
// `handler` must be a valid function; `user` is passed to it as is, from several threads
// at once when the function's `concurrency` is above 1.
void zh_run(zh_handler handler, void *user) ZH_NORETURN;

// Runs several functions from one program, each request with the handler of its function
// (`names[i]` runs `handlers[i]`), until the agent stops it; never returns. That is how one
// program serves a fused group (`fuse:` in the chain spec), each step called in turn on the
// same request. A program not started by the agent, or whose instance runs a function
// without a handler here, exits with status 2 and says why on standard error.
//
// # Safety
//
// `names` and `handlers` point at `count` entries each: NUL-terminated UTF-8 names and
// valid functions; `user` is passed to every handler as is, from several threads at once
// when the function's `concurrency` is above 1.
void zh_run_named(const char *const *names,
                  const zh_handler *handlers,
                  size_t count,
                  void *user) ZH_NORETURN;

// The body, writable in place; its length in `*len`. Valid until the handler returns, the
// body is resized (zh_set_len, zh_set_body, zh_extend) or a response header moves it up
// (zh_add_response_header).
//
// # Safety
//
// Every pointer is NULL or valid as zerohop.h says (the request for the handler call
// that got it, strings NUL-terminated, buffers as long as their lengths).
uint8_t *zh_body(struct zh_request *req, size_t *len);

// The most bytes the body may grow to in place (the slot's room). It may grow beyond, up to
// the chain's `max_body`: zh_set_len, zh_set_body and zh_extend then move the request into a
// large slot (one copy), and a pointer from zh_body is stale.
//
// # Safety
//
// Every pointer is NULL or valid as zerohop.h says (the request for the handler call
// that got it, strings NUL-terminated, buffers as long as their lengths).
size_t zh_capacity(struct zh_request *req);

// Sets the body's length (new bytes are zero). Beyond zh_capacity the request moves into a
// large slot. Returns 0, or 500 when `len` is over the largest slot the chain has (its
// `max_body`), 503 when every large slot is in use (nothing changes either way;
// zh_last_error says so, naming the room).
//
// # Safety
//
// Every pointer is NULL or valid as zerohop.h says (the request for the handler call
// that got it, strings NUL-terminated, buffers as long as their lengths).
uint16_t zh_set_len(struct zh_request *req, size_t len);

// Replaces the body with `len` bytes at `data` (beyond zh_capacity, in a large slot, as
// zh_set_len). Returns 0, or 500 when they do not fit (nothing changes), 503 when no large
// slot is free, 400 for a null `data` with a nonzero `len`.
//
// # Safety
//
// Every pointer is NULL or valid as zerohop.h says (the request for the handler call
// that got it, strings NUL-terminated, buffers as long as their lengths).
uint16_t zh_set_body(struct zh_request *req, const void *data, size_t len);

// Appends `len` bytes at `data` to the body (beyond zh_capacity, in a large slot, as
// zh_set_len). Returns 0, or 500 when they do not fit (nothing changes), 503 when no large
// slot is free, 400 for a null `data` with a nonzero `len`.
//
// # Safety
//
// Every pointer is NULL or valid as zerohop.h says (the request for the handler call
// that got it, strings NUL-terminated, buffers as long as their lengths).
uint16_t zh_extend(struct zh_request *req, const void *data, size_t len);

// The message of the last call on this request that returned a nonzero status
// (NUL-terminated; "" when none failed). Valid until the next call on the request.
//
// # Safety
//
// Every pointer is NULL or valid as zerohop.h says (the request for the handler call
// that got it, strings NUL-terminated, buffers as long as their lengths).
const char *zh_last_error(const struct zh_request *req);

// Fails the request with `status` (400 to 599; anything else is 500) and `message`
// (NULL: the last error's message); returns ZH_FAIL for `return zh_fail(...)`.
//
// # Safety
//
// Every pointer is NULL or valid as zerohop.h says (the request for the handler call
// that got it, strings NUL-terminated, buffers as long as their lengths).
enum zh_next zh_fail(struct zh_request *req, uint16_t status, const char *message);

// Sends the request on to `function` (one of this function's `next` in the spec); returns
// ZH_FORWARD for `return zh_forward(...)`, or ZH_FAIL (500) for a name that is not UTF-8.
//
// # Safety
//
// Every pointer is NULL or valid as zerohop.h says (the request for the handler call
// that got it, strings NUL-terminated, buffers as long as their lengths).
enum zh_next zh_forward(struct zh_request *req, const char *function);

// The gateway's id of this request.
//
// # Safety
//
// Every pointer is NULL or valid as zerohop.h says (the request for the handler call
// that got it, strings NUL-terminated, buffers as long as their lengths).
uint32_t zh_request_id(struct zh_request *req);

// This function's name (not NUL-terminated; its length in `*len`).
//
// # Safety
//
// Every pointer is NULL or valid as zerohop.h says (the request for the handler call
// that got it, strings NUL-terminated, buffers as long as their lengths).
const char *zh_function(struct zh_request *req, size_t *len);

// The HTTP method of the route the request came in by (not NUL-terminated).
//
// # Safety
//
// Every pointer is NULL or valid as zerohop.h says (the request for the handler call
// that got it, strings NUL-terminated, buffers as long as their lengths).
const char *zh_method(struct zh_request *req, size_t *len);

// The request's path (not NUL-terminated): as the client sent it (percent-encoded) when a
// function of the chain lists `:path` in its `headers`, else the route's path as the spec
// writes it (zh_route_path).
//
// # Safety
//
// Every pointer is NULL or valid as zerohop.h says (the request for the handler call
// that got it, strings NUL-terminated, buffers as long as their lengths).
const char *zh_path(struct zh_request *req, size_t *len);

// The request header `name` (case-insensitive) if the spec asked for it and the client
// sent it, else NULL. Not NUL-terminated; its length in `*len`.
//
// # Safety
//
// Every pointer is NULL or valid as zerohop.h says (the request for the handler call
// that got it, strings NUL-terminated, buffers as long as their lengths).
const char *zh_header(struct zh_request *req, const char *name, size_t *len);

// Calls `function` of this chain (one of this function's `calls`) with `len` bytes of
// `input` and waits for its answer (at most the chain's timeout). Never NULL; free it with
// zh_answer_free.
//
// # Safety
//
// Every pointer is NULL or valid as zerohop.h says (the request for the handler call
// that got it, strings NUL-terminated, buffers as long as their lengths).
struct zh_answer *zh_call(struct zh_request *req,
                          const char *function,
                          const void *input,
                          size_t len);

// Makes `n` calls at once (fan-out) and waits until every one answered (fan-in); the
// answers go to `answers[0..n]`, in order, each to be freed with zh_answer_free.
//
// # Safety
//
// Every pointer is NULL or valid as zerohop.h says (the request for the handler call
// that got it, strings NUL-terminated, buffers as long as their lengths).
void zh_call_all(struct zh_request *req,
                 const struct zh_call_spec *calls,
                 size_t n,
                 struct zh_answer **answers);

// The answer's status: 200 when the callee gave an output, else the call's error status
// (the callee's own, 502 if it died, 504 if it did not answer in time, 503 if it could not
// be reached, 500 if this function may not call it).
//
// # Safety
//
// Every pointer is NULL or valid as zerohop.h says (the request for the handler call
// that got it, strings NUL-terminated, buffers as long as their lengths).
uint16_t zh_answer_status(const struct zh_answer *answer);

// The answer's body: the callee's output, read in place (status 200), or the error's
// message. Valid until the answer is freed.
//
// # Safety
//
// Every pointer is NULL or valid as zerohop.h says (the request for the handler call
// that got it, strings NUL-terminated, buffers as long as their lengths).
const uint8_t *zh_answer_body(const struct zh_answer *answer, size_t *len);

// Frees an answer of zh_call or zh_call_all (and the callee's slot); NULL is ignored.
//
// # Safety
//
// `answer` must come from zh_call or zh_call_all and not have been freed (branches are
// freed by the runtime, not here).
void zh_answer_free(struct zh_answer *answer);

// How many branches of a static fan-out this function joins (0 for none).
//
// # Safety
//
// Every pointer is NULL or valid as zerohop.h says (the request for the handler call
// that got it, strings NUL-terminated, buffers as long as their lengths).
size_t zh_branches(struct zh_request *req);

// Branch `i` of the static fan-out this function joins, in the spec's `fan_out` order,
// as an answer owned by the request (do not free it); NULL for `i` out of range.
//
// # Safety
//
// Every pointer is NULL or valid as zerohop.h says (the request for the handler call
// that got it, strings NUL-terminated, buffers as long as their lengths).
const struct zh_answer *zh_branch(struct zh_request *req, size_t i);

// Reads the chain state's value of `key` (`key_len` bytes): returns 1 when found, with
// its length in `*len` and up to `cap` bytes of it copied to `buf` (a value longer than
// `cap` is not copied: call again with room for `*len`); 0 when absent; else the error's
// status (zh_last_error says more): 400 bad key, 500 no state store for this function.
//
// # Safety
//
// Every pointer is NULL or valid as zerohop.h says (the request for the handler call
// that got it, strings NUL-terminated, buffers as long as their lengths).
uint16_t zh_state_get(struct zh_request *req,
                      const void *key,
                      size_t key_len,
                      void *buf,
                      size_t cap,
                      size_t *len);

// Sets the chain state's `key` to `len` bytes of `value`. Returns 0, or the error's status:
// 507 store full, 413 value over the store's value_size, 400 bad key, 503 busy, 500 no
// state store for this function.
//
// # Safety
//
// Every pointer is NULL or valid as zerohop.h says (the request for the handler call
// that got it, strings NUL-terminated, buffers as long as their lengths).
uint16_t zh_state_put(struct zh_request *req,
                      const void *key,
                      size_t key_len,
                      const void *value,
                      size_t len);

// Removes the chain state's `key`: returns 1 if it was there, 0 if not, else the error's
// status as for zh_state_put.
//
// # Safety
//
// Every pointer is NULL or valid as zerohop.h says (the request for the handler call
// that got it, strings NUL-terminated, buffers as long as their lengths).
uint16_t zh_state_delete(struct zh_request *req, const void *key, size_t key_len);

// The path of the route the request came in by, as the spec writes it (`/item/{id}`,
// `/static/{*rest}`; not NUL-terminated).
//
// # Safety
//
// Every pointer is NULL or valid as zerohop.h says (the request for the handler call
// that got it, strings NUL-terminated, buffers as long as their lengths).
const char *zh_route_path(struct zh_request *req, size_t *len);

// The route's path parameter `name` (`id` for `GET /item/{id}`, `rest` for a trailing `*`),
// percent-decoded, else NULL. Parameters always arrive, listed in `headers` or not. Not
// NUL-terminated; its length in `*len`.
//
// # Safety
//
// Every pointer is NULL or valid as zerohop.h says (the request for the handler call
// that got it, strings NUL-terminated, buffers as long as their lengths).
const char *zh_param(struct zh_request *req, const char *name, size_t *len);

// The query string as the client sent it (after `?`, not decoded), when a function of the
// chain lists `:query` in its `headers` and the request had one, else NULL. Not
// NUL-terminated; its length in `*len`. zh_query decodes one parameter of it.
//
// # Safety
//
// Every pointer is NULL or valid as zerohop.h says (the request for the handler call
// that got it, strings NUL-terminated, buffers as long as their lengths).
const char *zh_query_string(struct zh_request *req, size_t *len);

// Reads the first value of query parameter `name` (`application/x-www-form-urlencoded`
// decoding: `+` is a space, `%XX` a byte), as zh_state_get reads a value: returns 1 when
// found, with its length in `*len` and the value copied to `buf` when it fits in `cap`
// bytes (not NUL-terminated; a longer one is not copied: call again with room for `*len`);
// 0 when absent (or `:query` is not listed); 400 for a NULL or non-UTF-8 `name`.
//
// # Safety
//
// Every pointer is NULL or valid as zerohop.h says (the request for the handler call
// that got it, strings NUL-terminated, buffers as long as their lengths).
uint16_t zh_query(struct zh_request *req, const char *name, char *buf, size_t cap, size_t *len);

// The value of cookie `name` from the request's `Cookie` headers, when a function of the
// chain lists `cookie` in its `headers`, else NULL. Not NUL-terminated; its length in
// `*len`.
//
// # Safety
//
// Every pointer is NULL or valid as zerohop.h says (the request for the handler call
// that got it, strings NUL-terminated, buffers as long as their lengths).
const char *zh_cookie(struct zh_request *req, const char *name, size_t *len);

// Adds the header `name: value` to the client's answer (HTTP only), e.g. `Location` with
// a 303 or `Set-Cookie`; a `Content-Type` replaces the route's. Returns 0, or 500 for a
// name that is not a header name or one the gateway sets (`Content-Length`,
// `Connection`, ...), a value with a line break, a 65th header, or one that does not fit
// the slot beside the body (nothing changes; zh_last_error says which); 400 for a NULL or
// non-UTF-8 `name` or `value`. The header rides in the slot before the body, which moves up:
// a pointer from zh_body is stale afterwards (call zh_body again).
//
// # Safety
//
// Every pointer is NULL or valid as zerohop.h says (the request for the handler call
// that got it, strings NUL-terminated, buffers as long as their lengths).
uint16_t zh_add_response_header(struct zh_request *req, const char *name, const char *value);

// Sets the answer's status for the client: 200 (the default) to 399, except 204, 205 and
// 304 (errors are zh_fail's). With a 3xx, add a `Location` (zh_add_response_header).
// Returns 0, or 500 for a status outside that range (nothing changes).
//
// # Safety
//
// Every pointer is NULL or valid as zerohop.h says (the request for the handler call
// that got it, strings NUL-terminated, buffers as long as their lengths).
uint16_t zh_set_status(struct zh_request *req, uint16_t status);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* ZEROHOP_H */
