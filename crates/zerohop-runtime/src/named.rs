//! Several handlers in one program, each registered by its function's name ([`Handlers`],
//! [`run_named`]): what a fused group's instances run (`fuse:` in the spec), and what lets
//! one binary serve as any of its functions.

use crate::request::{HandlerError, Next, Request};
use crate::{Handler, Instance, StartError};

/// Handlers by function name: a [`Handler`] that runs the one registered for the function
/// at hand ([`Request::function`]). In a fused group's instance that is each step in turn,
/// as function calls on the same slot; in a plain instance, its function's.
///
/// ```no_run
/// use zerohop_runtime::{run_named, Handlers, Next, Request};
///
/// fn main() {
///     run_named(
///         Handlers::new()
///             .on("upper", |req: &mut Request<'_>| {
///                 req.body_mut().make_ascii_uppercase();
///                 Ok(Next::Continue)
///             })
///             .on("exclaim", |req: &mut Request<'_>| {
///                 req.extend(b"!")?;
///                 Ok(Next::Continue)
///             }),
///     )
/// }
/// ```
#[derive(Default)]
pub struct Handlers {
    list: Vec<(String, Box<dyn Handler>)>,
}

impl Handlers {
    /// No handlers yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `handler` for the function named `function` (a later one for the same name
    /// replaces it).
    pub fn on(mut self, function: impl Into<String>, handler: impl Handler) -> Self {
        let function = function.into();
        self.list.retain(|(n, _)| *n != function);
        self.list.push((function, Box::new(handler)));
        self
    }

    /// The function names registered, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.list.iter().map(|(n, _)| n.as_str())
    }

    /// The handler registered for `function`.
    pub fn get(&self, function: &str) -> Option<&dyn Handler> {
        self.list
            .iter()
            .find(|(n, _)| n == function)
            .map(|(_, h)| &**h)
    }

    /// Why this program cannot run `instance`: the first function it runs that has no
    /// handler here.
    pub fn missing(&self, instance: &Instance) -> Option<String> {
        instance
            .functions()
            .into_iter()
            .find(|f| self.get(f).is_none())
    }
}

impl Handler for Handlers {
    fn handle(&self, req: &mut Request<'_>) -> Result<Next, HandlerError> {
        match self.get(req.function()) {
            Some(h) => h.handle(req),
            None => Err(HandlerError::internal(format!(
                "this program registers no handler for function `{}` (it has: {})",
                req.function(),
                self.names().collect::<Vec<_>>().join(", ")
            ))),
        }
    }
}

/// Runs this process's function, or every function of its fused group, with the handler
/// registered for each in `handlers`, until the agent stops it. Never returns. Refuses to
/// start (exit code 2, the reason in the log) when a function the instance runs has no
/// handler.
pub fn run_named(handlers: Handlers) -> ! {
    let instance = match crate::start() {
        Ok(i) => i,
        Err(e) => exit(e),
    };
    if let Some(f) = handlers.missing(&instance) {
        tracing::error!(
            "cannot start: this instance runs `{}`, and this program registers no handler for \
             `{f}` (it has: {})",
            instance.functions().join(", "),
            handlers.names().collect::<Vec<_>>().join(", ")
        );
        std::process::exit(2)
    }
    instance.serve(handlers)
}

fn exit(e: StartError) -> ! {
    tracing::error!("cannot start: {e}");
    std::process::exit(2)
}
