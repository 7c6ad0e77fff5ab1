//! {{name}}: a zerohop function. It upper-cases the request body in place, in the chain's
//! shared memory, and passes it on.

use zerohop_runtime::{run, Next, Request};

fn main() {
    run(|req: &mut Request<'_>| {
        req.body_mut().make_ascii_uppercase();
        Ok(Next::Continue)
    })
}
