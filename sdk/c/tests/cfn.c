/* cfn: a C function for the end-to-end tests, its behaviour chosen by CFN_MODE:
 *   upper     upper-cases the body in place
 *   oversize  grows the body one byte past the slot's room, fails with what the SDK says
 *   wrap      replaces the body with "<" body ">" built on the stack
 *   fail      answers 422 "refusing BODY"
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zerohop.h>

static zh_next handle(zh_request *req, void *user) {
    const char *mode = user;
    size_t len;
    uint8_t *body = zh_body(req, &len);
    if (strcmp(mode, "upper") == 0) {
        for (size_t i = 0; i < len; i++) body[i] = (uint8_t)toupper(body[i]);
        return ZH_CONTINUE;
    }
    if (strcmp(mode, "oversize") == 0) {
        uint16_t rc = zh_set_len(req, zh_capacity(req) + 1);
        if (rc != 0) return zh_fail(req, rc, NULL);
        return zh_fail(req, 500, "zh_set_len past the capacity succeeded");
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
    return zh_fail(req, 500, "unknown CFN_MODE");
}

int main(void) {
    const char *mode = getenv("CFN_MODE");
    zh_run(handle, (void *)(mode ? mode : "upper"));
}
