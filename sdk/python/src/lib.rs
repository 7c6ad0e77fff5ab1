//! `zerohop._native`: the Rust runtime as a Python module (PyO3). The Python package
//! `zerohop` (python/zerohop) wraps it; see docs/sdk-python.md.
//!
//! A handler gets a `Request`; `req.body` is a writable `memoryview` over the request's
//! bytes in the slot (no copy). The view must not outlive the handler: the slot goes on to
//! the next function (or is reused) once the handler returns, so a view still alive then
//! would point into another request. The instance checks this after every call: a view
//! still exported ends the process at once (the agent answers its requests 502 and starts a
//! new instance) instead of letting it write into later requests.

use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use pyo3::exceptions::{PyBufferError, PyRuntimeError};
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::PyBytes;
use zerohop_runtime::{Answer, CallError, HandlerError, Next, Request};

/// The request of one handler call. Its methods fail once the handler has returned.
#[pyclass(module = "zerohop._native")]
struct NativeRequest {
    req: *mut Request<'static>,
    /// SYNC POINT: every store and load of `live` and `views` happens with the GIL held
    /// (Python calls into this object, buffer exports and releases, and the check after the
    /// handler in `run`): the GIL orders them; the atomics only make the shared `Arc`s Sync.
    live: Arc<AtomicBool>,
    /// Buffers exported over the body and not yet released.
    views: Arc<AtomicUsize>,
}

// SAFETY: the pointer is only dereferenced while `live` is true, that is during the
// handler call that made it, on the thread running that call (which holds the GIL while
// Python code runs).
unsafe impl Send for NativeRequest {}
// SAFETY: as above.
unsafe impl Sync for NativeRequest {}

impl NativeRequest {
    // The request belongs to the handler call, not to this object, which only names it for
    // Python; calls on it are serialised by the GIL, and the body is not resized while a
    // view of it is exported (`no_views`).
    #[allow(clippy::mut_from_ref)]
    fn get(&self) -> PyResult<&mut Request<'static>> {
        if !self.live.load(Ordering::Acquire) {
            return Err(PyRuntimeError::new_err(
                "the request is gone: its handler has returned",
            ));
        }
        // SAFETY: live means the handler call that owns the request is still running.
        Ok(unsafe { &mut *self.req })
    }
}

/// A call's result as Python sees it: status 200 and the output, or the error's status and
/// message.
fn answer(py: Python<'_>, r: &Result<Answer, CallError>) -> (u16, Py<PyBytes>) {
    match r {
        Ok(a) => (200, PyBytes::new(py, a.body()).unbind()),
        Err(e) => (
            e.status,
            PyBytes::new(py, e.to_string().as_bytes()).unbind(),
        ),
    }
}

fn handler_error(e: HandlerError) -> PyErr {
    PyRuntimeError::new_err((e.status, e.message))
}

#[pymethods]
impl NativeRequest {
    /// The body's length.
    fn body_len(&self) -> PyResult<usize> {
        Ok(self.get()?.body().len())
    }

    /// The most bytes the body may grow to in place (beyond, it moves into a large slot).
    fn capacity(&self) -> PyResult<usize> {
        Ok(self.get()?.capacity())
    }

    /// Replaces the body with `data` (any bytes-like object).
    fn set_body(&self, data: &[u8]) -> PyResult<()> {
        self.no_views("replace the body")?;
        self.get()?.set_body(data).map_err(handler_error)
    }

    /// Appends `data` to the body.
    fn extend(&self, data: &[u8]) -> PyResult<()> {
        self.no_views("grow the body")?;
        self.get()?.extend(data).map_err(handler_error)
    }

    /// Sets the body's length.
    fn set_len(&self, len: usize) -> PyResult<()> {
        self.no_views("resize the body")?;
        self.get()?.set_len(len).map_err(handler_error)
    }

    /// The gateway's id of the request.
    fn id(&self) -> PyResult<u32> {
        Ok(self.get()?.id())
    }

    /// This function's name.
    fn function(&self) -> PyResult<String> {
        Ok(self.get()?.function().to_owned())
    }

    /// The route's HTTP method.
    fn method(&self) -> PyResult<String> {
        Ok(self.get()?.method().to_owned())
    }

    /// The request's path (as sent when `:path` is listed, else the route's).
    fn path(&self) -> PyResult<String> {
        Ok(self.get()?.path().to_owned())
    }

    /// The route's path as the spec writes it.
    fn route_path(&self) -> PyResult<String> {
        Ok(self.get()?.route_path().to_owned())
    }

    /// A request header the spec lists, if the client sent it.
    fn header(&self, name: &str) -> PyResult<Option<String>> {
        Ok(self.get()?.header(name).map(str::to_owned))
    }

    /// The route's path parameter `name`, percent-decoded.
    fn param(&self, name: &str) -> PyResult<Option<String>> {
        Ok(self.get()?.param(name).map(str::to_owned))
    }

    /// The query string as sent, when `:query` is listed and the request had one.
    fn query_string(&self) -> PyResult<Option<String>> {
        Ok(self.get()?.query_string().map(str::to_owned))
    }

    /// The first value of query parameter `name`, form-urlencoded decoded.
    fn query(&self, name: &str) -> PyResult<Option<String>> {
        Ok(self.get()?.query(name))
    }

    /// The value of cookie `name`, when `cookie` is listed.
    fn cookie(&self, name: &str) -> PyResult<Option<String>> {
        Ok(self.get()?.cookie(name).map(str::to_owned))
    }

    /// Adds a header to the client's answer; the body moves up within its slot, so no view
    /// of it may be alive.
    fn add_response_header(&self, name: &str, value: &str) -> PyResult<()> {
        self.no_views("add a response header (the body moves up)")?;
        self.get()?
            .add_response_header(name, value)
            .map_err(handler_error)
    }

    /// Sets the answer's status (200..=399 but 204, 205 and 304).
    fn set_status(&self, status: i64) -> PyResult<()> {
        let req = self.get()?;
        // Any integer: one past u16 is refused as the runtime refuses any status it may not use.
        let Ok(code) = u16::try_from(status) else {
            return Err(handler_error(HandlerError::status_refused(status)));
        };
        req.set_status(code).map_err(handler_error)
    }

    /// Calls `function` with `data`; (status, body bytes) where status 200 is an output.
    fn call(&self, py: Python<'_>, function: &str, data: &[u8]) -> PyResult<(u16, Py<PyBytes>)> {
        let req = self.get()?;
        // The GIL is released while the call waits: other handler threads run meanwhile.
        let result = py.detach(|| req.call(function, data));
        Ok(answer(py, &result))
    }

    /// Calls every `(function, data)` of `calls` at once; their `(status, body)` in order.
    fn call_all(
        &self,
        py: Python<'_>,
        calls: Vec<(String, PyBackedBytes)>,
    ) -> PyResult<Vec<(u16, Py<PyBytes>)>> {
        let req = self.get()?;
        // The inputs are read where Python holds them (no copy until the runtime's own
        // into each call's slot).
        let calls: Vec<(&str, &[u8])> = calls.iter().map(|(f, d)| (f.as_str(), &**d)).collect();
        // The GIL is released while the calls wait, as for `call`.
        let results = py.detach(|| req.call_all(&calls));
        Ok(results.iter().map(|r| answer(py, r)).collect())
    }

    /// The answers of a static fan-out's branches, `(status, body)` in the route's order
    /// (empty unless this function joins a fan-out).
    fn branches(&self, py: Python<'_>) -> PyResult<Vec<(u16, Py<PyBytes>)>> {
        Ok(self
            .get()?
            .branches()
            .iter()
            .map(|r| answer(py, r))
            .collect())
    }

    /// The chain state's value of `key`, or None.
    fn state_get(&self, py: Python<'_>, key: &[u8]) -> PyResult<Option<Py<PyBytes>>> {
        let req = self.get()?;
        let state = req.state().map_err(handler_error)?;
        let got = py
            .detach(|| state.get(key))
            .map_err(|e| handler_error(e.into()))?;
        Ok(got.map(|v| PyBytes::new(py, &v).unbind()))
    }

    /// Sets the chain state's `key` to `value`.
    fn state_put(&self, py: Python<'_>, key: &[u8], value: &[u8]) -> PyResult<()> {
        let req = self.get()?;
        let state = req.state().map_err(handler_error)?;
        py.detach(|| state.put(key, value))
            .map_err(|e| handler_error(e.into()))
    }

    /// Removes the chain state's `key`; whether it was there.
    fn state_delete(&self, py: Python<'_>, key: &[u8]) -> PyResult<bool> {
        let req = self.get()?;
        let state = req.state().map_err(handler_error)?;
        py.detach(|| state.delete(key))
            .map_err(|e| handler_error(e.into()))
    }

    /// The buffer protocol: the body, writable, in place.
    unsafe fn __getbuffer__(
        slf: PyRefMut<'_, Self>,
        view: *mut pyo3::ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let req = slf.get()?;
        let body = req.body_mut();
        let (ptr, len) = (body.as_mut_ptr(), body.len());
        let views = slf.views.clone();
        let obj = slf.into_ptr();
        // SAFETY: `view` is the interpreter's buffer to fill and `obj` a new reference to
        // this object; the memory stays valid while the handler runs, and a view alive
        // after it ends the process (see the crate docs).
        let r =
            unsafe { pyo3::ffi::PyBuffer_FillInfo(view, obj, ptr.cast(), len as isize, 0, flags) };
        // SAFETY: PyBuffer_FillInfo took a reference of its own to `obj` when it succeeded.
        unsafe { pyo3::ffi::Py_DECREF(obj) };
        if r != 0 {
            return Err(PyBufferError::new_err("cannot export the body"));
        }
        views.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// A view of the body was released.
    unsafe fn __releasebuffer__(&self, _view: *mut pyo3::ffi::Py_buffer) {
        self.views.fetch_sub(1, Ordering::AcqRel);
    }
}

impl NativeRequest {
    fn no_views(&self, what: &str) -> PyResult<()> {
        if self.views.load(Ordering::Acquire) > 0 {
            return Err(PyBufferError::new_err(format!(
                "cannot {what} while a memoryview of it is alive; release it first \
                 (`view.release()`, or `with req.body as view:`)"
            )));
        }
        Ok(())
    }
}

/// Runs `dispatch(req) -> (kind, status, text)` for every request until the agent stops the
/// instance; never returns. `dispatch` is the Python layer's wrapper around the user's
/// handler; `kind` is 0 continue, 1 reply, 2 forward to the function `text`, 3 fail with
/// `status` and the message `text`.
#[pyfunction]
fn run(py: Python<'_>, dispatch: Py<PyAny>) -> PyResult<()> {
    let dispatch = Arc::new(dispatch);
    py.detach(move || {
        zerohop_runtime::run(move |req: &mut Request<'_>| {
            Python::attach(|py| {
                let live = Arc::new(AtomicBool::new(true));
                let views = Arc::new(AtomicUsize::new(0));
                let native = NativeRequest {
                    req: (req as *mut Request<'_>).cast::<Request<'static>>(),
                    live: live.clone(),
                    views: views.clone(),
                };
                let outcome = Py::new(py, native)
                    .and_then(|obj| dispatch.call1(py, (obj,)))
                    .and_then(|d| d.extract::<(u8, u16, String)>(py));
                live.store(false, Ordering::Release);
                if views.load(Ordering::Acquire) > 0 {
                    eprintln!(
                        "zerohop: the handler kept a memoryview of the request body after it \
                         returned; the slot goes on to another request, so the instance stops \
                         here (release views before returning: `with req.body as view:`)"
                    );
                    std::process::abort();
                }
                match outcome {
                    Ok((0, _, _)) => Ok(Next::Continue),
                    Ok((1, _, _)) => Ok(Next::Reply),
                    Ok((2, _, name)) => Ok(Next::Forward(name)),
                    Ok((_, status, message)) => Err(HandlerError::new(status, message)),
                    Err(e) => Err(HandlerError::internal(format!(
                        "the Python layer failed: {}",
                        e.value(py)
                            .str()
                            .map(|s| s.to_string())
                            .unwrap_or_else(|_| "?".into())
                    ))),
                }
            })
        })
    })
}

/// The native part of the `zerohop` package.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<NativeRequest>()?;
    m.add_function(wrap_pyfunction!(run, m)?)?;
    Ok(())
}
