/* The C row of zerohop-bench-languages, the same pass-through as pass.rs beside it: reads
 * the body's first byte in place (no copy) and sends the body on unchanged. */
#include <zerohop.h>

static zh_next pass(zh_request *req, void *user) {
    (void)user;
    size_t len;
    const uint8_t *body = zh_body(req, &len);
    /* volatile: the read happens, as it does in every other language's pass. */
    if (len > 0) (void)*(const volatile uint8_t *)body;
    return ZH_CONTINUE;
}

int main(void) { zh_run(pass, NULL); }
