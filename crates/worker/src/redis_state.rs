//! State kept in Redis instead of a session, for measuring sessions side by side with
//! the usual way (XFaaS §4): weak operations are GET/SET/DEL; a strong read-modify-write
//! is Redis's own optimistic transaction, WATCH + GET, then MULTI/SET/EXEC, which fails
//! (a conflict: the guest retries) when the key changed in between.

use std::cell::RefCell;
use std::time::Instant;

use anyhow::{Context, Result};
use skiff_session::{Error, Mode, State};

pub struct RedisState {
    client: redis::Client,
}

thread_local! {
    /// A request runs on one thread from start to end, so its WATCH lives on this
    /// thread's connection.
    static CONNECTION: RefCell<Option<redis::Connection>> = const { RefCell::new(None) };
    /// A WATCH is open on this thread's connection.
    static WATCHING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl RedisState {
    /// `address` is `HOST:PORT` or a `redis://` URL.
    pub fn connect(address: &str) -> Result<RedisState> {
        let url = if address.contains("://") {
            address.to_owned()
        } else {
            format!("redis://{address}")
        };
        let client =
            redis::Client::open(url.as_str()).with_context(|| format!("redis at {url}"))?;
        client
            .get_connection()
            .with_context(|| format!("connecting to redis at {url}"))?;
        Ok(RedisState { client })
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&mut redis::Connection) -> redis::RedisResult<T>,
    ) -> Result<T, Error> {
        CONNECTION.with(|slot| {
            let mut slot = slot.borrow_mut();
            if slot.is_none() {
                *slot = Some(self.client.get_connection().map_err(unavailable)?);
            }
            let result = f(slot.as_mut().expect("connected"));
            if result.is_err() {
                // A broken connection is not reused.
                *slot = None;
            }
            result.map_err(unavailable)
        })
    }
}

fn unavailable(e: redis::RedisError) -> Error {
    Error::Unavailable(format!("redis: {e}"))
}

impl State for RedisState {
    fn read(
        &self,
        _txn: u64,
        key: &[u8],
        mode: Mode,
        _: Instant,
    ) -> Result<Option<Vec<u8>>, Error> {
        self.with(|c| {
            if mode == Mode::Strong {
                redis::cmd("WATCH").arg(key).exec(c)?;
                WATCHING.set(true);
            }
            redis::cmd("GET").arg(key).query(c)
        })
    }

    fn write(
        &self,
        _txn: u64,
        key: &[u8],
        value: &[u8],
        mode: Mode,
        _: Instant,
    ) -> Result<(), Error> {
        let committed: bool = self.with(|c| match mode {
            Mode::Weak => redis::cmd("SET").arg(key).arg(value).exec(c).map(|()| true),
            Mode::Strong => {
                // EXEC answers nil when a watched key changed.
                // EXEC ends the WATCH either way.
                WATCHING.set(false);
                let done: Option<Vec<redis::Value>> = redis::pipe()
                    .atomic()
                    .cmd("SET")
                    .arg(key)
                    .arg(value)
                    .query(c)?;
                Ok(done.is_some())
            }
        })?;
        if committed {
            Ok(())
        } else {
            Err(Error::Conflict)
        }
    }

    fn delete(&self, _txn: u64, key: &[u8], _: Instant) -> Result<bool, Error> {
        self.with(|c| redis::cmd("DEL").arg(key).query::<i64>(c).map(|n| n > 0))
    }

    fn finish(&self, _txn: u64) {
        if WATCHING.replace(false) {
            let _ = self.with(|c| redis::cmd("UNWATCH").exec(c));
        }
    }
}
