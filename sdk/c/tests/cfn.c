/* cfn: a C function for the end-to-end tests, its behaviour chosen by CFN_MODE:
 *   upper     upper-cases the body in place
 *   grow      sets the body's length to CFN_GROW bytes of 'z' (past the slot's room it moves
 *             into a large slot; past max_body it fails with what the SDK says)
 *   wrap      replaces the body with "<" body ">" built on the stack
 *   fail      answers 422 "refusing BODY"
 *   call      calls every function named in CFN_CALLS (comma separated) at once with the
 *             body; answers "name=output;" per call, "name!status:message;" for a failed one
 *   join      answers "i=output;" per branch of the static fan-out it joins
 *   count     adds one to the state counter named by the body, answers the new count
 *   header    answers the value of the x-test header ("<none>" without it)
 *   route     answers "METHOD PATH function id>0"
 *   item      for GET /item/{id} with `headers: [":path", ":query", cookie]`: answers
 *             303 with a Location and a Set-Cookie naming the id, and a body of what it read
 *             (path, route, param, query string, decoded query q, cookie session, what a
 *             refused header and status said); its function lists :path, :query and cookie
 *   forward   forwards to CFN_TARGET
 *   sleep     says "cfn: holding BODY" on stderr (zerohop up echoes it: the test knows the
 *             request reached the handler), sleeps 2 s (60 s for a body starting with
 *             "hold": a request the test kills, which only the kill ends in time), then
 *             upper-cases
 */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zerohop.h>

/* Appends text to the body, failing the request when it does not fit. */
#define APPEND(req, data, len)                              \
    do {                                                    \
        uint16_t rc_ = zh_extend((req), (data), (len));     \
        if (rc_ != 0) return zh_fail((req), rc_, NULL);     \
    } while (0)

static zh_next answer_calls(zh_request *req, zh_answer **answers, const char **names, size_t n) {
    uint16_t rc = zh_set_len(req, 0);
    if (rc != 0) return zh_fail(req, rc, NULL);
    char head[64];
    for (size_t i = 0; i < n; i++) {
        size_t len;
        const uint8_t *body = zh_answer_body(answers[i], &len);
        uint16_t status = zh_answer_status(answers[i]);
        int h = status == 200 ? snprintf(head, sizeof head, "%s=", names[i])
                              : snprintf(head, sizeof head, "%s!%u:", names[i], status);
        APPEND(req, head, (size_t)h);
        APPEND(req, body, len);
        APPEND(req, ";", 1);
    }
    return ZH_CONTINUE;
}

/* "(pointer, length)" as printf arguments, "-" for NULL. */
#define OR_DASH(p, n) (int)((p) ? (n) : 1), ((p) ? (p) : "-")

static zh_next item(zh_request *req) {
    size_t pl, rl, il, sl, cl, ql;
    const char *path = zh_path(req, &pl), *route = zh_route_path(req, &rl);
    const char *id = zh_param(req, "id", &il), *raw = zh_query_string(req, &sl);
    const char *session = zh_cookie(req, "session", &cl);
    char q[64];
    uint16_t found = zh_query(req, "q", q, sizeof q, &ql);
    if (found > 1) return zh_fail(req, found, NULL);
    if (found == 1 && ql > sizeof q) return zh_fail(req, 413, "query q too long");
    const char *qv = found == 1 ? q : NULL;
    /* Refused: a header the gateway owns, a 404 (an error is zh_fail's). */
    uint16_t owned = zh_add_response_header(req, "Content-Length", "1");
    char why[160];
    snprintf(why, sizeof why, "%s", zh_last_error(req));
    uint16_t bad = zh_set_status(req, 404);
    char out[768];
    int n = snprintf(out, sizeof out,
                     "path=%.*s route=%.*s id=%.*s query=%.*s q=%.*s session=%.*s "
                     "refused=%u:%s status404=%u",
                     (int)pl, path, (int)rl, route, OR_DASH(id, il), OR_DASH(raw, sl),
                     OR_DASH(qv, ql), OR_DASH(session, cl), owned, why, bad);
    if (n < 0 || (size_t)n >= sizeof out) return zh_fail(req, 413, "too long to answer");
    uint16_t rc = zh_set_body(req, out, (size_t)n);
    if (rc != 0) return zh_fail(req, rc, NULL);
    /* After the body: the headers move it up within the slot. */
    char location[96], cookie[96];
    snprintf(location, sizeof location, "/item/%.*s/done", OR_DASH(id, il));
    snprintf(cookie, sizeof cookie, "seen=%.*s; Path=/", OR_DASH(id, il));
    if ((rc = zh_add_response_header(req, "Location", location)) != 0 ||
        (rc = zh_add_response_header(req, "Set-Cookie", cookie)) != 0 ||
        (rc = zh_set_status(req, 303)) != 0)
        return zh_fail(req, rc, NULL);
    return ZH_CONTINUE;
}

static zh_next handle(zh_request *req, void *user) {
    const char *mode = user;
    size_t len;
    uint8_t *body = zh_body(req, &len);
    if (strcmp(mode, "upper") == 0) {
        for (size_t i = 0; i < len; i++) body[i] = (uint8_t)toupper(body[i]);
        return ZH_CONTINUE;
    }
    if (strcmp(mode, "grow") == 0) {
        const char *want = getenv("CFN_GROW");
        uint16_t rc = zh_set_len(req, want ? (size_t)strtoull(want, NULL, 10) : 0);
        if (rc != 0) return zh_fail(req, rc, NULL);
        /* Past the slot's room the body moved into a large slot: look it up again. */
        body = zh_body(req, &len);
        memset(body, 'z', len);
        return ZH_CONTINUE;
    }
    if (strcmp(mode, "wrap") == 0) {
        char buf[256];
        int n = snprintf(buf, sizeof buf, "<%.*s>", (int)len, (const char *)body);
        if (n < 0 || (size_t)n >= sizeof buf) return zh_fail(req, 413, "too long to wrap");
        uint16_t rc = zh_set_body(req, buf, (size_t)n);
        return rc ? zh_fail(req, rc, NULL) : ZH_CONTINUE;
    }
    if (strcmp(mode, "fail") == 0) {
        char msg[128];
        snprintf(msg, sizeof msg, "refusing %.*s", (int)len, (const char *)body);
        return zh_fail(req, 422, msg);
    }
    if (strcmp(mode, "call") == 0) {
        char list[256];
        const char *calls = getenv("CFN_CALLS");
        snprintf(list, sizeof list, "%s", calls ? calls : "");
        const char *names[8];
        zh_call_spec specs[8];
        size_t n = 0;
        for (char *save = NULL, *name = strtok_r(list, ",", &save); name && n < 8;
             name = strtok_r(NULL, ",", &save)) {
            names[n] = name;
            specs[n] = (zh_call_spec){.function = name, .input = body, .len = len};
            n++;
        }
        zh_answer *answers[8];
        zh_call_all(req, specs, n, answers);
        zh_next next = answer_calls(req, answers, names, n);
        for (size_t i = 0; i < n; i++) zh_answer_free(answers[i]);
        return next;
    }
    if (strcmp(mode, "join") == 0) {
        size_t n = zh_branches(req);
        uint16_t rc = zh_set_len(req, 0);
        if (rc != 0) return zh_fail(req, rc, NULL);
        for (size_t i = 0; i < n; i++) {
            char head[32];
            size_t blen;
            const zh_answer *b = zh_branch(req, i);
            const uint8_t *out = zh_answer_body(b, &blen);
            int h = snprintf(head, sizeof head, "%zu=", i);
            APPEND(req, head, (size_t)h);
            APPEND(req, out, blen);
            APPEND(req, ";", 1);
        }
        return zh_branch(req, n) == NULL ? ZH_CONTINUE : zh_fail(req, 500, "a branch past the end");
    }
    if (strcmp(mode, "count") == 0) {
        char key[128];
        snprintf(key, sizeof key, "%.*s", (int)len, (const char *)body);
        uint64_t count = 0;
        size_t got;
        uint16_t rc = zh_state_get(req, key, strlen(key), &count, sizeof count, &got);
        if (rc > 1) return zh_fail(req, rc, NULL);
        if (rc == 0 || got != sizeof count) count = 0;
        count++;
        rc = zh_state_put(req, key, strlen(key), &count, sizeof count);
        if (rc != 0) return zh_fail(req, rc, NULL);
        char out[32];
        int n = snprintf(out, sizeof out, "%llu", (unsigned long long)count);
        rc = zh_set_body(req, out, (size_t)n);
        return rc ? zh_fail(req, rc, NULL) : ZH_CONTINUE;
    }
    if (strcmp(mode, "header") == 0) {
        size_t vlen;
        const char *v = zh_header(req, "X-Test", &vlen);
        uint16_t rc = v ? zh_set_body(req, v, vlen) : zh_set_body(req, "<none>", 6);
        return rc ? zh_fail(req, rc, NULL) : ZH_CONTINUE;
    }
    if (strcmp(mode, "route") == 0) {
        size_t ml, pl, fl;
        const char *m = zh_method(req, &ml), *p = zh_path(req, &pl), *f = zh_function(req, &fl);
        char out[256];
        int n = snprintf(out, sizeof out, "%.*s %.*s %.*s %s", (int)ml, m, (int)pl, p, (int)fl,
                         f, zh_request_id(req) > 0 ? "id>0" : "id=0");
        uint16_t rc = zh_set_body(req, out, (size_t)n);
        return rc ? zh_fail(req, rc, NULL) : ZH_CONTINUE;
    }
    if (strcmp(mode, "item") == 0) return item(req);
    if (strcmp(mode, "forward") == 0) {
        const char *target = getenv("CFN_TARGET");
        return zh_forward(req, target ? target : "");
    }
    if (strcmp(mode, "sleep") == 0) {
        fprintf(stderr, "cfn: holding %.*s\n", (int)len, (const char *)body);
        fflush(stderr);
        sleep(len >= 4 && memcmp(body, "hold", 4) == 0 ? 60 : 2);
        for (size_t i = 0; i < len; i++) body[i] = (uint8_t)toupper(body[i]);
        return ZH_CONTINUE;
    }
    return zh_fail(req, 500, "unknown CFN_MODE");
}

int main(void) {
    const char *mode = getenv("CFN_MODE");
    zh_run(handle, (void *)(mode ? mode : "upper"));
}
