//! Safe bindings to skiff's wasm guest API, the `skiff` import module.
//!
//! A function is a `cdylib` built for `wasm32-wasip1` that exports `handle: () -> ()`.
//! The request body is the input and the output is the response body:
//!
//! ```ignore
//! fn hello(input: Vec<u8>) -> Vec<u8> {
//!     [b"hello, ".as_slice(), &input].concat()
//! }
//! skiff_guest::handler!(hello);
//! ```
//!
//! State is per session. A weak read or write sees and sets the latest value with no
//! coordination; a strong read opens an atomic read-modify-write on its key that the
//! strong write of the same key commits ([`update`] does both and retries on
//! [`Error::Conflict`]).

#![warn(missing_docs)]

use std::fmt;

/// The raw imports; every pointer and length is an i32 into this module's memory.
mod sys {
    #[link(wasm_import_module = "skiff")]
    extern "C" {
        pub fn input_len() -> i32;
        pub fn read_input(buf: *mut u8, len: i32) -> i32;
        pub fn set_output(buf: *const u8, len: i32) -> i32;
        pub fn read_state(
            key: *const u8,
            key_len: i32,
            buf: *mut u8,
            buf_len: i32,
            mode: i32,
        ) -> i32;
        pub fn write_state(
            key: *const u8,
            key_len: i32,
            val: *const u8,
            val_len: i32,
            mode: i32,
        ) -> i32;
        pub fn delete_state(key: *const u8, key_len: i32) -> i32;
        pub fn publish(name: *const u8, name_len: i32, val: *const u8, val_len: i32) -> i32;
        pub fn read_published(
            addr: *const u8,
            addr_len: i32,
            name: *const u8,
            name_len: i32,
            buf: *mut u8,
            buf_len: i32,
        ) -> i32;
    }
}

/// How a state access is coordinated with other instances of the same session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The latest value, no coordination (mode 0).
    Weak = 0,
    /// A read opens an atomic read-modify-write that the strong write commits (mode 1).
    Strong = 1,
}

/// A failed host call: the negative return codes other than -1 (absent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// -2: the key changed since the strong read; redo the read-modify-write.
    Conflict,
    /// -3: the key's lock was not granted in time.
    LockTimeout,
    /// -4: the session's state cannot be reached.
    Unavailable,
    /// -5: a pointer out of bounds, a key too long or reserved (starting with a 0 byte).
    BadArgument,
    /// Any other negative code.
    Other(i32),
}

impl Error {
    /// The error for a negative return code (not -1, which means absent).
    pub fn from_code(code: i32) -> Error {
        match code {
            -2 => Error::Conflict,
            -3 => Error::LockTimeout,
            -4 => Error::Unavailable,
            -5 => Error::BadArgument,
            other => Error::Other(other),
        }
    }

    /// The host's return code for this error.
    pub fn code(self) -> i32 {
        match self {
            Error::Conflict => -2,
            Error::LockTimeout => -3,
            Error::Unavailable => -4,
            Error::BadArgument => -5,
            Error::Other(code) => code,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Conflict => f.write_str("conflict"),
            Error::LockTimeout => f.write_str("lock timeout"),
            Error::Unavailable => f.write_str("state unavailable"),
            Error::BadArgument => f.write_str("bad argument"),
            Error::Other(code) => write!(f, "error code {code}"),
        }
    }
}

impl std::error::Error for Error {}

/// The host's lengths are i32; a larger slice cannot be passed at all.
fn len(bytes: &[u8]) -> Result<i32, Error> {
    i32::try_from(bytes.len()).map_err(|_| Error::BadArgument)
}

/// A non-negative return is a success; -1 is handled by the callers that can see it.
fn check(ret: i32) -> Result<i32, Error> {
    if ret >= 0 {
        Ok(ret)
    } else {
        Err(Error::from_code(ret))
    }
}

/// Most values fit the first try; larger ones cost one more call.
const FIRST_READ: usize = 4096;

/// Calls `read(buf, buf_len)` with a growing buffer until the whole value fits.
/// The value may change between calls, so the size is rechecked each time.
fn read_grow(mut read: impl FnMut(*mut u8, i32) -> i32) -> Result<Option<Vec<u8>>, Error> {
    let mut buf: Vec<u8> = Vec::with_capacity(FIRST_READ);
    loop {
        let cap = buf.capacity().min(i32::MAX as usize);
        let ret = read(buf.as_mut_ptr(), cap as i32);
        if ret == -1 {
            return Ok(None);
        }
        let full = check(ret)? as usize;
        if full <= cap {
            // SAFETY: the host copied `full` bytes into the buffer's spare capacity.
            unsafe { buf.set_len(full) };
            return Ok(Some(buf));
        }
        buf.reserve_exact(full);
    }
}

/// The request body.
pub fn input() -> Vec<u8> {
    // SAFETY: plain host calls; the host writes at most `n` bytes into `buf`.
    unsafe {
        let n = sys::input_len().max(0) as usize;
        let mut buf: Vec<u8> = Vec::with_capacity(n);
        let copied = sys::read_input(buf.as_mut_ptr(), n as i32).clamp(0, n as i32);
        buf.set_len(copied as usize);
        buf
    }
}

/// Sets the response body (status 200); a later call replaces an earlier one.
///
/// Panics (a trap, answered 500) if the host refuses it, which only a buffer over
/// 2 GiB can cause.
pub fn set_output(out: &[u8]) {
    // SAFETY: `out` is a live slice of this module's memory.
    let ret = len(out).and_then(|n| check(unsafe { sys::set_output(out.as_ptr(), n) }));
    if let Err(err) = ret {
        panic!("skiff: set_output failed: {err}");
    }
}

/// The value of `key` in this session's state, `None` when absent.
///
/// A strong read opens a read-modify-write on `key`; commit it with a strong
/// [`write_state`] (or use [`update`]). A value larger than the first buffer is read
/// again, with the same mode, into one of its size.
pub fn read_state(key: impl AsRef<[u8]>, mode: Mode) -> Result<Option<Vec<u8>>, Error> {
    let key = key.as_ref();
    let key_len = len(key)?;
    // SAFETY: the key is a live slice; `read_grow` passes a buffer of `buf_len` bytes.
    read_grow(|buf, buf_len| unsafe {
        sys::read_state(key.as_ptr(), key_len, buf, buf_len, mode as i32)
    })
}

/// Sets `key` to `value`. In strong mode it commits the read-modify-write opened by
/// a strong read of `key`, and fails with [`Error::Conflict`] if the key changed since.
pub fn write_state(
    key: impl AsRef<[u8]>,
    value: impl AsRef<[u8]>,
    mode: Mode,
) -> Result<(), Error> {
    let (key, value) = (key.as_ref(), value.as_ref());
    let (key_len, value_len) = (len(key)?, len(value)?);
    // SAFETY: both are live slices of this module's memory.
    check(unsafe {
        sys::write_state(
            key.as_ptr(),
            key_len,
            value.as_ptr(),
            value_len,
            mode as i32,
        )
    })?;
    Ok(())
}

/// Removes `key`; true if it existed.
pub fn delete_state(key: impl AsRef<[u8]>) -> Result<bool, Error> {
    let key = key.as_ref();
    let key_len = len(key)?;
    // SAFETY: the key is a live slice of this module's memory.
    Ok(check(unsafe { sys::delete_state(key.as_ptr(), key_len) })? == 1)
}

/// Publishes `value` under `name` for other sessions to read with [`read_published`].
pub fn publish(name: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Result<(), Error> {
    let (name, value) = (name.as_ref(), value.as_ref());
    let (name_len, value_len) = (len(name)?, len(value)?);
    // SAFETY: both are live slices of this module's memory.
    check(unsafe { sys::publish(name.as_ptr(), name_len, value.as_ptr(), value_len) })?;
    Ok(())
}

/// The value the session at address `addr` published under `name`, `None` when absent.
pub fn read_published(
    addr: impl AsRef<[u8]>,
    name: impl AsRef<[u8]>,
) -> Result<Option<Vec<u8>>, Error> {
    let (addr, name) = (addr.as_ref(), name.as_ref());
    let (addr_len, name_len) = (len(addr)?, len(name)?);
    // SAFETY: live slices; `read_grow` passes a buffer of `buf_len` bytes.
    read_grow(|buf, buf_len| unsafe {
        sys::read_published(
            addr.as_ptr(),
            addr_len,
            name.as_ptr(),
            name_len,
            buf,
            buf_len,
        )
    })
}

/// Atomically replaces `key`'s value with `f(old)` and returns the new value: a strong
/// read, then a strong write, redone from the read whenever the write meets
/// [`Error::Conflict`] (so `f` may run more than once). The function's timeout bounds
/// the retries.
pub fn update(
    key: impl AsRef<[u8]>,
    mut f: impl FnMut(Option<&[u8]>) -> Vec<u8>,
) -> Result<Vec<u8>, Error> {
    let key = key.as_ref();
    loop {
        let old = read_state(key, Mode::Strong)?;
        let new = f(old.as_deref());
        match write_state(key, &new, Mode::Strong) {
            Ok(()) => return Ok(new),
            Err(Error::Conflict) => continue,
            Err(err) => return Err(err),
        }
    }
}

/// Defines an export that calls `f(input())` and sets its result as the output.
///
/// `handler!(f)` defines `handle`, the request entry point; `handler!(name = f)`
/// defines the export `name`, e.g. a session key hook (`key: wasm:name`). `f` takes
/// the input as `Vec<u8>` and returns anything that is `AsRef<[u8]>` (`Vec<u8>`,
/// `String`, `&str`).
#[macro_export]
macro_rules! handler {
    ($name:ident = $f:path) => {
        #[no_mangle]
        pub extern "C" fn $name() {
            let out = $f($crate::input());
            $crate::set_output(::core::convert::AsRef::<[u8]>::as_ref(&out));
        }
    };
    ($f:path) => {
        $crate::handler!(handle = $f);
    };
}
