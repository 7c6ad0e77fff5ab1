/* upper: a zerohop function in C that upper-cases the request body in place. */
#include <ctype.h>
#include <zerohop.h>

static zh_next upper(zh_request *req, void *user) {
    (void)user;
    size_t len;
    uint8_t *body = zh_body(req, &len);
    for (size_t i = 0; i < len; i++) body[i] = (uint8_t)toupper(body[i]);
    return ZH_CONTINUE;
}

int main(void) { zh_run(upper, NULL); }
