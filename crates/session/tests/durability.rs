mod common;

use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Instant, SystemTime};

use common::{after, TempDir};
use skiff_session::{Durability, Locking, Mode, Space, State};

type Map = BTreeMap<Vec<u8>, Vec<u8>>;

fn open(dir: &Path, durability: Durability) -> Space {
    Space::open(dir, durability, Locking::Pessimistic).unwrap()
}

fn contents(space: &Space) -> Map {
    space.entries().into_iter().collect()
}

/// A small xorshift generator: tests need varied bytes, not good randomness.
struct Rng(u64);

impl Rng {
    fn seeded() -> Rng {
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        Rng(u64::from(nanos) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn bytes(&mut self, max: u64) -> Vec<u8> {
        (0..self.below(max + 1))
            .map(|_| self.next() as u8)
            .collect()
    }
}

/// Applies random writes and deletes to `state` and `model` alike.
fn scribble(space: &Space, model: &mut Map, rng: &mut Rng, ops: usize) {
    for _ in 0..ops {
        let key = rng.bytes(3);
        if rng.below(4) == 0 {
            assert_eq!(
                space.delete(1, &key, after(100)).unwrap(),
                model.remove(&key).is_some()
            );
        } else {
            let value = if rng.below(50) == 0 {
                rng.bytes(3 << 20)
            } else {
                rng.bytes(300)
            };
            space
                .write(1, &key, &value, Mode::Weak, after(100))
                .unwrap();
            model.insert(key, value);
        }
    }
}

fn wal_segments(dir: &Path) -> Vec<PathBuf> {
    let mut segments: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_str().unwrap().starts_with("wal."))
        .collect();
    segments.sort();
    segments
}

#[test]
fn checkpoint_round_trip_is_exact() {
    let dir = TempDir::new("checkpoint");
    let mut rng = Rng::seeded();
    let mut model = Map::new();
    {
        let space = open(dir.path(), Durability::Checkpoint);
        space
            .write(1, b"", b"empty key", Mode::Weak, after(100))
            .unwrap();
        space
            .write(1, b"empty value", b"", Mode::Weak, after(100))
            .unwrap();
        model.insert(b"".to_vec(), b"empty key".to_vec());
        model.insert(b"empty value".to_vec(), b"".to_vec());
        scribble(&space, &mut model, &mut rng, 2000);
        space.checkpoint().unwrap();
        // Checkpoint durability: what comes after the last checkpoint is not kept.
        space
            .write(1, b"later", b"x", Mode::Weak, after(100))
            .unwrap();
    }
    let space = open(dir.path(), Durability::Checkpoint);
    assert_eq!(contents(&space), model);
    assert_eq!(space.len(), model.len());
    // Again, from a restored space (and now with the log on).
    scribble(&space, &mut model, &mut rng, 500);
    space.checkpoint().unwrap();
    drop(space);
    assert_eq!(contents(&open(dir.path(), Durability::Wal)), model);
}

#[test]
fn a_corrupt_checkpoint_is_an_error() {
    let dir = TempDir::new("corrupt");
    {
        let space = open(dir.path(), Durability::Checkpoint);
        for i in 0..100u32 {
            space
                .write(1, &i.to_le_bytes(), &[i as u8; 100], Mode::Weak, after(100))
                .unwrap();
        }
        space.checkpoint().unwrap();
    }
    let path = dir.path().join("checkpoint");
    let good = fs::read(&path).unwrap();
    let mut flipped = good.clone();
    flipped[good.len() / 2] ^= 1;
    let mut magic = good.clone();
    magic[0] = b'X';
    for bad in [
        flipped,
        magic,
        good[..good.len() - 1].to_vec(),
        good[..10].to_vec(),
        [&good[..], b"x"].concat(),
    ] {
        fs::write(&path, bad).unwrap();
        let err = Space::open(dir.path(), Durability::Checkpoint, Locking::Pessimistic)
            .err()
            .unwrap();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidData, "{err}");
    }
    fs::write(&path, good).unwrap();
    assert_eq!(open(dir.path(), Durability::Checkpoint).len(), 100);
}

#[test]
fn the_log_replays_acknowledged_writes() {
    let dir = TempDir::new("wal");
    let mut rng = Rng::seeded();
    let mut model = Map::new();
    {
        let space = open(dir.path(), Durability::Wal);
        scribble(&space, &mut model, &mut rng, 1000);
        // Strong writes and deletes are logged too.
        space.read(2, b"strong", Mode::Strong, after(100)).unwrap();
        space
            .write(2, b"strong", b"committed", Mode::Strong, after(100))
            .unwrap();
        model.insert(b"strong".to_vec(), b"committed".to_vec());
    }
    let space = open(dir.path(), Durability::Wal);
    assert_eq!(contents(&space), model);
    // A checkpoint starts a new segment and deletes the old one; writes after it replay
    // on top of it.
    scribble(&space, &mut model, &mut rng, 300);
    space.checkpoint().unwrap();
    assert_eq!(wal_segments(dir.path()).len(), 1);
    scribble(&space, &mut model, &mut rng, 300);
    drop(space);
    assert_eq!(contents(&open(dir.path(), Durability::Wal)), model);
}

#[test]
fn a_torn_last_record_is_ignored() {
    let dir = TempDir::new("torn");
    {
        let space = open(dir.path(), Durability::Wal);
        space
            .write(1, b"a", &[1; 1000], Mode::Weak, after(100))
            .unwrap();
        space
            .write(1, b"b", &[2; 1000], Mode::Weak, after(100))
            .unwrap();
        space
            .write(1, b"c", &[3; 1000], Mode::Weak, after(100))
            .unwrap();
    }
    let segment = wal_segments(dir.path()).pop().unwrap();
    // The last record cut short, as a crash mid-append leaves it.
    let len = fs::metadata(&segment).unwrap().len();
    OpenOptions::new()
        .write(true)
        .open(&segment)
        .unwrap()
        .set_len(len - 500)
        .unwrap();
    {
        let space = open(dir.path(), Durability::Wal);
        let mut keys: Vec<_> = space.entries().into_iter().map(|(k, _)| k).collect();
        keys.sort();
        assert_eq!(keys, [b"a", b"b"]);
        // The torn tail was cut off, so what is appended now is found after it.
        space
            .write(1, b"d", &[4; 10], Mode::Weak, after(100))
            .unwrap();
    }
    // Garbage after the last record: a length running past the end, or a bad checksum.
    let mut garbage = OpenOptions::new().append(true).open(&segment).unwrap();
    garbage.write_all(&[0xff; 40]).unwrap();
    drop(garbage);
    assert_eq!(open(dir.path(), Durability::Wal).len(), 3);
    let mut bad_crc = OpenOptions::new().append(true).open(&segment).unwrap();
    bad_crc
        .write_all(&[20, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4])
        .unwrap();
    bad_crc.write_all(&[0; 20]).unwrap();
    drop(bad_crc);
    let space = open(dir.path(), Durability::Wal);
    assert_eq!(space.get(b"d").unwrap(), [4; 10]);
    assert_eq!(space.len(), 3);
}

#[test]
fn a_corrupt_older_segment_is_an_error() {
    let dir = TempDir::new("older");
    {
        let space = open(dir.path(), Durability::Wal);
        space
            .write(1, b"a", &[1; 100], Mode::Weak, after(100))
            .unwrap();
    }
    let segment = wal_segments(dir.path()).pop().unwrap();
    let mut bytes = fs::read(&segment).unwrap();
    bytes[30] ^= 1;
    fs::write(&segment, bytes).unwrap();
    // A newer segment exists: the damaged one was complete, so this is not a torn append.
    let newer = segment.with_extension(format!("{:020}", 99));
    fs::write(newer, b"").unwrap();
    let err = Space::open(dir.path(), Durability::Wal, Locking::Pessimistic)
        .err()
        .unwrap();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidData, "{err}");
}

#[test]
fn one_process_at_a_time() {
    let dir = TempDir::new("dirlock");
    let space = open(dir.path(), Durability::Wal);
    assert!(Space::open(dir.path(), Durability::Wal, Locking::Pessimistic).is_err());
    drop(space);
    open(dir.path(), Durability::Wal);
}

#[test]
fn concurrent_writers_share_fsyncs() {
    let dir = TempDir::new("group");
    let space = Arc::new(open(dir.path(), Durability::Wal));
    let started = Instant::now();
    for i in 0..20u32 {
        space
            .write(1, &i.to_le_bytes(), b"serial", Mode::Weak, after(10_000))
            .unwrap();
    }
    let serial = started.elapsed() / 20;
    let started = Instant::now();
    let threads: Vec<_> = (0..50u32)
        .map(|t| {
            let space = space.clone();
            thread::spawn(move || {
                for i in 0..20u32 {
                    let key = [t.to_le_bytes(), i.to_le_bytes()].concat();
                    space
                        .write(t.into(), &key, b"grouped", Mode::Weak, after(10_000))
                        .unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let grouped = started.elapsed() / 1000;
    println!("log write: {serial:?} alone, {grouped:?} per write with 50 writers");
    drop(space);
    assert_eq!(open(dir.path(), Durability::Wal).len(), 1020);
}

const CHILD: &str = "SKIFF_SESSION_TEST_CHILD_DIR";

/// The child half of `acknowledged_writes_survive_sigkill`: writes until killed, printing
/// each write and delete once it is acknowledged.
#[test]
fn sigkill_child() {
    let Some(dir) = std::env::var_os(CHILD) else {
        return;
    };
    let round = std::env::var("SKIFF_SESSION_TEST_ROUND").unwrap();
    let space = Arc::new(open(Path::new(&dir), Durability::Wal));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let space = space.clone();
            let round = round.clone();
            thread::spawn(move || {
                let mut rng = Rng::seeded();
                for i in 0..100_000 {
                    let key = format!("{round}-{t}-{i}");
                    let value = value_of(&key, rng.below(64 << 10) as usize);
                    space
                        .write(t, key.as_bytes(), &value, Mode::Weak, after(10_000))
                        .unwrap();
                    println!("put {key} {}", value.len());
                    if i % 3 == 0 {
                        space.delete(t, key.as_bytes(), after(10_000)).unwrap();
                        println!("del {key}");
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

fn value_of(key: &str, len: usize) -> Vec<u8> {
    key.bytes().cycle().take(len).collect()
}

#[test]
fn acknowledged_writes_survive_sigkill() {
    let dir = TempDir::new("sigkill");
    let mut rng = Rng::seeded();
    let mut acked_puts = BTreeMap::new();
    let mut acked_deletes = Vec::new();
    for round in 0..3 {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "sigkill_child",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, dir.path())
            .env("SKIFF_SESSION_TEST_ROUND", round.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let kill_after = 20 + rng.below(400);
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut seen = 0;
        for line in lines {
            let line = line.unwrap();
            let words: Vec<&str> = line.split(' ').collect();
            match words[..] {
                ["put", key, len] => {
                    acked_puts.insert(key.to_string(), len.parse::<usize>().unwrap());
                }
                ["del", key] => acked_deletes.push(key.to_string()),
                _ => continue,
            }
            seen += 1;
            if seen == kill_after {
                child.kill().unwrap();
            }
        }
        child.wait().unwrap();
        assert!(seen >= kill_after, "the child stopped early");
    }
    let space = open(dir.path(), Durability::Wal);
    for (key, len) in &acked_puts {
        let value = space.get(key.as_bytes());
        if acked_deletes.contains(key) {
            assert!(value.is_none(), "{key} was deleted");
        } else if value != Some(value_of(key, *len)) {
            // A delete follows every third put: the child may have died before saying so.
            let deleting = key.rsplit('-').next().unwrap().parse::<u64>().unwrap() % 3 == 0;
            assert!(deleting && value.is_none(), "{key} was lost");
        }
    }
    // Nothing else is there, bar the one write each thread may have had under way.
    assert!(space.len() <= acked_puts.len() - acked_deletes.len() + 3 * 4);
}

#[test]
fn wal_stays_quiet_without_writes() {
    let dir = TempDir::new("quiet");
    let space = open(dir.path(), Durability::Wal);
    space.read(1, b"k", Mode::Weak, after(0)).unwrap();
    assert!(!space.delete(1, b"k", after(0)).unwrap());
    drop(space);
    let segment = wal_segments(dir.path()).pop().unwrap();
    assert_eq!(fs::metadata(segment).unwrap().len(), 0);
}
