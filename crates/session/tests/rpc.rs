mod common;

use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::{after, TempDir};
use skiff_session::{serve, Durability, Error, Locking, Mode, Remote, Space, State};

/// A primary serving its space on a socket in `dir`.
fn primary(dir: &TempDir, durability: Durability, locking: Locking) -> (Arc<Space>, PathBuf) {
    let space = Arc::new(Space::open(&dir.path().join("state"), durability, locking).unwrap());
    let socket = dir.path().join("primary.sock");
    serve(space.clone(), UnixListener::bind(&socket).unwrap()).unwrap();
    (space, socket)
}

fn counter(value: Option<Vec<u8>>) -> u64 {
    value.map_or(0, |v| u64::from_le_bytes(v.try_into().unwrap()))
}

fn increment(state: &dyn State, txn: u64) {
    loop {
        let n = counter(state.read(txn, b"n", Mode::Strong, after(10_000)).unwrap());
        match state.write(
            txn,
            b"n",
            &(n + 1).to_le_bytes(),
            Mode::Strong,
            after(10_000),
        ) {
            Ok(()) => break,
            Err(Error::Conflict) => continue,
            Err(e) => panic!("{e}"),
        }
    }
    state.finish(txn);
}

/// Two secondaries (six threads each) and the primary's own requests (four threads) use
/// the same txn numbers: they must be kept apart, and the increments linearizable.
fn increments_from_everywhere(durability: Durability, locking: Locking) {
    let dir = TempDir::new("increments");
    let (space, socket) = primary(&dir, durability, locking);
    let remotes: Vec<Arc<dyn State>> = vec![
        Arc::new(Remote::connect(&socket).unwrap()),
        Arc::new(Remote::connect(&socket).unwrap()),
    ];
    let mut threads = Vec::new();
    for t in 0..16u64 {
        let state: Arc<dyn State> = match t {
            0..=5 => remotes[0].clone(),
            6..=11 => remotes[1].clone(),
            _ => space.clone(),
        };
        threads.push(thread::spawn(move || {
            for i in 0..50 {
                increment(&*state, (t % 6) * 1000 + i);
            }
        }));
    }
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(counter(space.get(b"n")), 16 * 50);
}

#[test]
fn remote_pessimistic_increments_are_linearizable() {
    increments_from_everywhere(Durability::Checkpoint, Locking::Pessimistic);
}

#[test]
fn remote_optimistic_increments_are_linearizable() {
    increments_from_everywhere(Durability::Checkpoint, Locking::Optimistic);
}

#[test]
fn remote_increments_with_the_log() {
    increments_from_everywhere(Durability::Wal, Locking::Pessimistic);
}

#[test]
fn remote_operations_round_trip() {
    let dir = TempDir::new("roundtrip");
    let (space, socket) = primary(&dir, Durability::Checkpoint, Locking::Pessimistic);
    let remote = Remote::connect(&socket).unwrap();
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    remote
        .write(1, b"big", &big, Mode::Weak, after(1000))
        .unwrap();
    remote
        .write(1, b"empty", b"", Mode::Weak, after(1000))
        .unwrap();
    remote
        .write(1, b"", b"empty key", Mode::Strong, after(1000))
        .unwrap();
    assert!(remote.read(1, b"big", Mode::Weak, after(1000)).unwrap() == Some(big.clone()));
    assert_eq!(
        remote.read(1, b"empty", Mode::Weak, after(1000)).unwrap(),
        Some(Vec::new())
    );
    assert_eq!(
        remote
            .read(1, b"", Mode::Weak, after(1000))
            .unwrap()
            .unwrap(),
        b"empty key"
    );
    assert_eq!(
        remote.read(1, b"missing", Mode::Weak, after(1000)).unwrap(),
        None
    );
    assert!(remote.delete(1, b"empty", after(1000)).unwrap());
    assert!(!remote.delete(1, b"empty", after(1000)).unwrap());
    remote.finish(1);
    assert!(space.get(b"big") == Some(big));
    assert_eq!(space.len(), 2);
}

#[test]
fn remote_locks_and_deadlines() {
    let dir = TempDir::new("locks");
    let (space, socket) = primary(&dir, Durability::Checkpoint, Locking::Pessimistic);
    let (a, b) = (
        Remote::connect(&socket).unwrap(),
        Remote::connect(&socket).unwrap(),
    );
    a.read(7, b"k", Mode::Strong, after(1000)).unwrap();
    // The same txn number elsewhere is another request: it waits, until its deadline.
    let started = Instant::now();
    assert_eq!(
        b.read(7, b"k", Mode::Strong, after(200)),
        Err(Error::LockTimeout)
    );
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(200) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
    assert_eq!(
        space.read(7, b"k", Mode::Weak, after(20)),
        Err(Error::LockTimeout)
    );
    // Nor does finishing it elsewhere release a's lock.
    b.finish(7);
    assert_eq!(
        b.write(8, b"k", b"x", Mode::Weak, after(20)),
        Err(Error::LockTimeout)
    );
    b.finish(8);
    // a's own weak write goes ahead; its finish releases the lock.
    a.write(7, b"k", b"a", Mode::Weak, after(20)).unwrap();
    a.finish(7);
    assert_eq!(
        b.read(9, b"k", Mode::Strong, after(20)).unwrap().unwrap(),
        b"a"
    );
    b.finish(9);
}

#[test]
fn a_dropped_connection_releases_its_locks() {
    let dir = TempDir::new("dropped");
    let (space, socket) = primary(&dir, Durability::Checkpoint, Locking::Pessimistic);
    let secondary = Remote::connect(&socket).unwrap();
    secondary.read(1, b"k", Mode::Strong, after(1000)).unwrap();
    secondary.read(2, b"j", Mode::Strong, after(1000)).unwrap();
    assert_eq!(
        space.read(1, b"k", Mode::Strong, after(50)),
        Err(Error::LockTimeout)
    );
    let waiter = {
        let space = space.clone();
        thread::spawn(move || space.read(1, b"j", Mode::Strong, after(5000)))
    };
    // The secondary dies without finishing its requests.
    drop(secondary);
    assert_eq!(space.read(1, b"k", Mode::Strong, after(5000)), Ok(None));
    assert_eq!(waiter.join().unwrap(), Ok(None));
}

#[test]
fn a_gone_primary_is_unavailable() {
    let dir = TempDir::new("gone");
    let socket = dir.path().join("fake.sock");
    assert!(Remote::connect(&socket).is_err());
    // A "primary" that accepts connections and closes them at once.
    let listener = UnixListener::bind(&socket).unwrap();
    thread::spawn(move || listener.incoming().for_each(drop));
    let remote = Remote::connect(&socket).unwrap();
    let unavailable = |r: Result<Option<Vec<u8>>, Error>| matches!(r, Err(Error::Unavailable(_)));
    assert!(unavailable(remote.read(1, b"k", Mode::Strong, after(1000))));
    // The request lost its connection (and with it any lock): it cannot go on.
    assert!(unavailable(remote.read(1, b"k", Mode::Weak, after(1000))));
    remote.finish(1);
    // A new request tries a new connection.
    assert!(unavailable(remote.read(2, b"k", Mode::Weak, after(1000))));
}
