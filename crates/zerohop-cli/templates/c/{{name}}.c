/* {{name}}: a zerohop function in C. It upper-cases the request body in place, in the
 * chain's shared memory, and passes it on. */
#include <ctype.h>
#include <zerohop.h>

static zh_next handle(zh_request *req, void *user) {
    (void)user;
    size_t len;
    uint8_t *body = zh_body(req, &len);
    for (size_t i = 0; i < len; i++) body[i] = (uint8_t)toupper(body[i]);
    return ZH_CONTINUE;
}

int main(void) { zh_run(handle, NULL); }
