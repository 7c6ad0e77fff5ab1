/* Step 5 of the polyglot chain, in C: checks that the Node.js step came before it, appends
 * its tag and answers the client. A body starting with `SLEEP-C:` first says "c: holding the
 * request" on standard error and holds it for a minute (the tests wait for that line, then
 * kill the instance while it holds the request). */
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <zerohop.h>

static zh_next handle(zh_request *req, void *user) {
    (void)user;
    size_t len;
    const uint8_t *body = zh_body(req, &len);
    if (len < 3 || memcmp(body + len - 3, "+js", 3) != 0)
        return zh_fail(req, 500, "c: the Node.js step did not run first");
    if (len >= 8 && memcmp(body, "SLEEP-C:", 8) == 0) {
        fputs("c: holding the request\n", stderr);
        sleep(60);
    }
    if (zh_extend(req, "+c", 2) != 0) return zh_fail(req, 0, NULL);
    return ZH_REPLY;
}

int main(void) { zh_run(handle, NULL); }
