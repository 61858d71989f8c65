mod common;

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::{after, TempDir};
use skiff_session::{Durability, Error, Locking, Mode, Space, State};

fn open(dir: &TempDir, locking: Locking) -> Arc<Space> {
    Arc::new(Space::open(dir.path(), Durability::Checkpoint, locking).unwrap())
}

fn counter(value: Option<Vec<u8>>) -> u64 {
    value.map_or(0, |v| u64::from_le_bytes(v.try_into().unwrap()))
}

/// Strong read, add one, strong write; retried on conflict (optimistic).
fn increment(state: &dyn State, txn: u64, key: &[u8]) {
    loop {
        let n = counter(state.read(txn, key, Mode::Strong, after(10_000)).unwrap());
        match state.write(
            txn,
            key,
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

fn hammer(space: Arc<Space>) {
    let threads: Vec<_> = (0..50u64)
        .map(|t| {
            let space = space.clone();
            thread::spawn(move || {
                for i in 0..200 {
                    increment(&*space, t * 1000 + i, b"n");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(counter(space.get(b"n")), 10_000);
}

#[test]
fn pessimistic_increments_are_linearizable() {
    let dir = TempDir::new("pessimistic");
    hammer(open(&dir, Locking::Pessimistic));
}

#[test]
fn optimistic_increments_with_retry_are_linearizable() {
    let dir = TempDir::new("optimistic");
    hammer(open(&dir, Locking::Optimistic));
}

#[test]
fn weak_writes_are_atomic() {
    let dir = TempDir::new("weak");
    let space = open(&dir, Locking::Pessimistic);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..4u8)
        .map(|w| {
            let space = space.clone();
            thread::spawn(move || {
                for i in 0..300 {
                    let value = vec![w * 50 + (i % 50) as u8; 64 << 10];
                    space
                        .write(u64::from(w), b"k", &value, Mode::Weak, after(1000))
                        .unwrap();
                }
            })
        })
        .collect();
    let readers: Vec<_> = (0..2)
        .map(|r| {
            let (space, stop) = (space.clone(), stop.clone());
            thread::spawn(move || {
                let mut seen = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    if let Some(v) = space.read(100 + r, b"k", Mode::Weak, after(1000)).unwrap() {
                        assert_eq!(v.len(), 64 << 10);
                        assert!(v.iter().all(|&b| b == v[0]), "a torn value");
                        seen += 1;
                    }
                }
                seen
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for r in readers {
        assert!(r.join().unwrap() > 0);
    }
    assert_eq!(space.len(), 1);
    assert_eq!(space.bytes(), 1 + (64 << 10));
}

#[test]
fn a_held_lock_blocks_others_until_finish() {
    let dir = TempDir::new("finish");
    let space = open(&dir, Locking::Pessimistic);
    space.write(9, b"k", b"v0", Mode::Weak, after(100)).unwrap();
    assert_eq!(
        space
            .read(1, b"k", Mode::Strong, after(100))
            .unwrap()
            .unwrap(),
        b"v0"
    );
    // Re-reading returns the value; the holder's own weak ops go ahead.
    assert_eq!(
        space
            .read(1, b"k", Mode::Strong, after(0))
            .unwrap()
            .unwrap(),
        b"v0"
    );
    space.write(1, b"k", b"v1", Mode::Weak, after(0)).unwrap();
    for result in [
        space.read(2, b"k", Mode::Strong, after(30)).map(drop),
        space.read(2, b"k", Mode::Weak, after(30)).map(drop),
        space.write(2, b"k", b"x", Mode::Weak, after(30)),
        space.write(2, b"k", b"x", Mode::Strong, after(30)),
        space.delete(2, b"k", after(30)).map(drop),
    ] {
        assert_eq!(result, Err(Error::LockTimeout));
    }
    // Other keys are free.
    space
        .write(2, b"other", b"x", Mode::Strong, after(0))
        .unwrap();
    space.finish(1);
    assert_eq!(
        space
            .read(2, b"k", Mode::Strong, after(0))
            .unwrap()
            .unwrap(),
        b"v1"
    );
    space.finish(2);
    assert_eq!(space.get(b"k").unwrap(), b"v1");
}

#[test]
fn a_strong_write_commits_and_wakes_a_waiter() {
    let dir = TempDir::new("wake");
    let space = open(&dir, Locking::Pessimistic);
    // The lock of an absent key is held too.
    assert_eq!(space.read(1, b"k", Mode::Strong, after(100)).unwrap(), None);
    let waiter = {
        let space = space.clone();
        thread::spawn(move || {
            let started = Instant::now();
            let v = space.read(2, b"k", Mode::Strong, after(5000)).unwrap();
            space.finish(2);
            (v, started.elapsed())
        })
    };
    thread::sleep(Duration::from_millis(50));
    space
        .write(1, b"k", b"committed", Mode::Strong, after(100))
        .unwrap();
    let (v, waited) = waiter.join().unwrap();
    assert_eq!(v.unwrap(), b"committed");
    assert!(
        waited >= Duration::from_millis(40) && waited < Duration::from_secs(2),
        "{waited:?}"
    );
    // The write released the lock: finish has nothing left, and others go at once.
    space.finish(1);
    space.write(3, b"k", b"x", Mode::Weak, after(0)).unwrap();
}

#[test]
fn lock_timeout_waits_until_the_deadline() {
    let dir = TempDir::new("timeout");
    let space = open(&dir, Locking::Pessimistic);
    space.read(1, b"k", Mode::Strong, after(100)).unwrap();
    let started = Instant::now();
    assert_eq!(
        space.read(2, b"k", Mode::Strong, after(150)),
        Err(Error::LockTimeout)
    );
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(150) && waited < Duration::from_secs(2),
        "{waited:?}"
    );
    // A timed-out request holds nothing.
    space.finish(2);
    assert_eq!(
        space.read(3, b"k", Mode::Weak, after(0)),
        Err(Error::LockTimeout)
    );
    space.finish(1);
    assert_eq!(space.read(3, b"k", Mode::Weak, after(0)), Ok(None));
    assert!(space.is_empty());
}

#[test]
fn optimistic_conflicts() {
    let dir = TempDir::new("conflicts");
    let space = open(&dir, Locking::Optimistic);
    let deadline = || after(100);
    space.write(9, b"k", b"0", Mode::Weak, deadline()).unwrap();

    // No locks: others proceed while a read is open; a change since makes the write fail.
    assert_eq!(
        space
            .read(1, b"k", Mode::Strong, deadline())
            .unwrap()
            .unwrap(),
        b"0"
    );
    space.write(2, b"k", b"2", Mode::Weak, deadline()).unwrap();
    assert_eq!(
        space.write(1, b"k", b"1", Mode::Strong, deadline()),
        Err(Error::Conflict)
    );
    // The failed write forgot the read: a strong write without one is plain.
    space
        .write(1, b"k", b"1", Mode::Strong, deadline())
        .unwrap();
    space.finish(1);

    // Unchanged: commits.
    space.read(1, b"k", Mode::Strong, deadline()).unwrap();
    space
        .write(1, b"k", b"3", Mode::Strong, deadline())
        .unwrap();
    space.finish(1);

    // A delete is a change; so is a key that came and went (no version is reused).
    space.read(1, b"k", Mode::Strong, deadline()).unwrap();
    assert!(space.delete(2, b"k", deadline()).unwrap());
    assert_eq!(
        space.write(1, b"k", b"4", Mode::Strong, deadline()),
        Err(Error::Conflict)
    );
    assert_eq!(space.read(1, b"k", Mode::Strong, deadline()).unwrap(), None);
    space.write(2, b"k", b"5", Mode::Weak, deadline()).unwrap();
    assert!(space.delete(2, b"k", deadline()).unwrap());
    assert_eq!(
        space.write(1, b"k", b"4", Mode::Strong, deadline()),
        Err(Error::Conflict)
    );
    space.finish(1);
    assert_eq!(space.get(b"k"), None);

    // Reads are per request: another's read does not vouch for this one.
    space.read(1, b"k", Mode::Strong, deadline()).unwrap();
    space.read(2, b"k", Mode::Strong, deadline()).unwrap();
    space
        .write(2, b"k", b"6", Mode::Strong, deadline())
        .unwrap();
    assert_eq!(
        space.write(1, b"k", b"7", Mode::Strong, deadline()),
        Err(Error::Conflict)
    );
    assert_eq!(space.get(b"k").unwrap(), b"6");
}

#[test]
fn operator_views() {
    let dir = TempDir::new("views");
    let space = open(&dir, Locking::Pessimistic);
    let deadline = || after(100);
    space.write(1, b"a", b"1", Mode::Weak, deadline()).unwrap();
    space.write(1, b"bb", b"", Mode::Weak, deadline()).unwrap();
    space
        .write(1, b"c", b"333", Mode::Weak, deadline())
        .unwrap();
    space.write(1, b"c", b"33", Mode::Weak, deadline()).unwrap();
    assert!(!space.delete(1, b"zz", deadline()).unwrap());
    // A lock on an absent key is not an entry.
    space.read(1, b"locked", Mode::Strong, deadline()).unwrap();
    assert_eq!(space.len(), 3);
    assert_eq!(space.bytes(), 2 + 2 + 3);
    let mut entries = space.entries();
    entries.sort();
    let expect: Vec<(Vec<u8>, Vec<u8>)> = vec![
        (b"a".into(), b"1".into()),
        (b"bb".into(), b"".into()),
        (b"c".into(), b"33".into()),
    ];
    assert_eq!(entries, expect);
    // get does not wait for the lock.
    assert_eq!(space.get(b"locked"), None);
    assert!(space.delete(1, b"a", deadline()).unwrap());
    assert_eq!((space.len(), space.bytes()), (2, 5));
    assert_eq!(space.get(b"bb").unwrap(), b"");
}

/// The per-operation cost of an uncontended weak read of a 1 KB value (printed; run with
/// `--release --nocapture` for a figure that means something).
#[test]
fn uncontended_weak_read_cost() {
    let dir = TempDir::new("cost");
    let space = open(&dir, Locking::Pessimistic);
    for i in 0..1000u32 {
        space
            .write(0, &i.to_le_bytes(), &[7; 1024], Mode::Weak, after(100))
            .unwrap();
    }
    let n: u32 = if cfg!(debug_assertions) {
        100_000
    } else {
        1_000_000
    };
    let deadline = after(60_000);
    let started = Instant::now();
    let mut total = 0;
    for i in 0..n {
        total += space
            .read(1, &(i % 1000).to_le_bytes(), Mode::Weak, deadline)
            .unwrap()
            .unwrap()
            .len();
    }
    let per_op = started.elapsed() / n;
    assert_eq!(total, n as usize * 1024);
    println!("uncontended weak read of 1 KB: {per_op:?} per op");
    let started = Instant::now();
    for i in 0..n {
        space.read(i.into(), b"0", Mode::Strong, deadline).unwrap();
        space
            .write(i.into(), b"0", &[8; 1024], Mode::Strong, deadline)
            .unwrap();
        space.finish(i.into());
    }
    println!(
        "uncontended strong read + strong write + finish of 1 KB: {:?} per request",
        started.elapsed() / n
    );
    assert!(per_op < Duration::from_micros(50), "{per_op:?}");
}
