//! The Node-API calls napi-rs has no safe form for here: an ArrayBuffer over memory the
//! addon does not own (the request's body in its slot), and a reference to it. napi-rs's
//! `ArrayBuffer::from_external` would box a finalizer for every request, and where an engine
//! refuses external memory it silently hands out a copy, whose writes would be lost.
//! Detaching is napi-rs's own `ArrayBuffer::detach`. Every `unsafe` block of the crate that
//! calls Node-API directly is here.

use std::ptr;

use napi::bindgen_prelude::{ArrayBuffer, FromNapiValue};
use napi::{sys, Env, Error, Result, Status};

/// A reference to an ArrayBuffer over a request's body, which keeps it alive until
/// [`BodyRef::detach`]: so that the ArrayBuffer can still be found and detached then, and
/// a detach by anyone else (a transfer, which would move the memory to another
/// ArrayBuffer) can be told.
pub(crate) struct BodyRef {
    raw: sys::napi_ref,
}

/// What [`BodyRef::detach`] found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Detached {
    /// Detached now: no view of it reaches the memory any more.
    Now,
    /// Already detached by JavaScript (`ArrayBuffer.prototype.transfer`, or a transfer
    /// list): the memory may live on in another ArrayBuffer.
    Before,
}

fn check(status: sys::napi_status, what: &str) -> Result<()> {
    if status == sys::Status::napi_ok {
        Ok(())
    } else {
        Err(Error::new(
            Status::GenericFailure,
            format!("{what} failed ({})", Status::from(status)),
        ))
    }
}

/// A new ArrayBuffer over `len` bytes at `data` (not copied, not owned: no finalizer frees
/// them), and a reference to it.
///
/// # Safety
///
/// `data..data + len` must stay valid for reads and writes until [`BodyRef::detach`] is
/// called on the returned reference, and the caller must call it before that memory is
/// used for anything else: JavaScript reads and writes the memory through the ArrayBuffer
/// until then. `len` must not be 0 (an empty body has no memory to point at; use a plain
/// empty ArrayBuffer).
pub(crate) unsafe fn external_arraybuffer<'env>(
    env: &'env Env,
    data: *mut u8,
    len: usize,
) -> Result<(ArrayBuffer<'env>, BodyRef)> {
    let mut value = ptr::null_mut();
    // SAFETY: `env` is the live env of this call; the memory is valid as the caller
    // promises. No finalizer: the memory is the slot's, freed by the runtime, never by V8.
    let status = unsafe {
        sys::napi_create_external_arraybuffer(
            env.raw(),
            data.cast(),
            len,
            None,
            ptr::null_mut(),
            &mut value,
        )
    };
    check(status, "napi_create_external_arraybuffer")?;
    let mut raw = ptr::null_mut();
    // SAFETY: `value` is the ArrayBuffer just made, in this env's current scope.
    let status = unsafe { sys::napi_create_reference(env.raw(), value, 1, &mut raw) };
    check(status, "napi_create_reference")?;
    // SAFETY: `value` is an ArrayBuffer of this env.
    let buffer = unsafe { ArrayBuffer::from_napi_value(env.raw(), value) }?;
    Ok((buffer, BodyRef { raw }))
}

impl BodyRef {
    /// The ArrayBuffer.
    pub(crate) fn get<'env>(&self, env: &'env Env) -> Result<ArrayBuffer<'env>> {
        let mut value = ptr::null_mut();
        // SAFETY: `raw` is a live reference of this env (deleted only by `detach`, which
        // consumes it).
        let status = unsafe { sys::napi_get_reference_value(env.raw(), self.raw, &mut value) };
        check(status, "napi_get_reference_value")?;
        // SAFETY: the reference is strong and was made to an ArrayBuffer of this env.
        unsafe { ArrayBuffer::from_napi_value(env.raw(), value) }
    }

    /// Detaches the ArrayBuffer: every view of it reads as empty from now on, and none
    /// reaches the memory any more. Then drops the reference.
    pub(crate) fn detach(self, env: &Env) -> Result<Detached> {
        let found = self.get(env).and_then(|buffer| {
            if buffer.is_detached()? {
                return Ok(Detached::Before);
            }
            buffer.detach()?;
            Ok(Detached::Now)
        });
        // SAFETY: `raw` is a live reference of this env, deleted once: `self` is consumed.
        let status = unsafe { sys::napi_delete_reference(env.raw(), self.raw) };
        let deleted = check(status, "napi_delete_reference");
        let found = found?;
        deleted.map(|()| found)
    }
}
