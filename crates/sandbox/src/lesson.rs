//! What a template's spares should do while they wait, learnt from an instance forked
//! from it: which pages that instance made its own on its way to its first reply (each
//! a copy-on-write fault, ~3 µs here), and which file pages it mapped (fork copies no
//! page-table entries for those, so each is a fault in every child). A spare that
//! populates both ranges before its plan comes takes those faults off the start's path.
//! Read from /proc/PID/pagemap: bit 63 says a page is present, bit 56 that this process
//! alone maps it (for an anonymous page of a fork: it was written since).

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::FileExt as _;

/// `madvise` advice: fault the pages in as if read.
pub const POPULATE_READ: u64 = 22;
/// `madvise` advice: fault the pages in as if written (breaks copy-on-write sharing).
pub const POPULATE_WRITE: u64 = 23;

const PAGE: u64 = 4096;
const PRESENT: u64 = 1 << 63;
const EXCLUSIVE: u64 = 1 << 56;

/// `(start, length, advice)` ranges for the pages process `pid` wrote in its private
/// writable mappings and mapped from read-only files; at most `max_pages` pages in
/// written ranges (each costs a spare a page of memory).
pub fn learn(pid: i32, max_pages: u64) -> std::io::Result<Vec<[u64; 3]>> {
    let maps = BufReader::new(File::open(format!("/proc/{pid}/maps"))?);
    let pagemap = File::open(format!("/proc/{pid}/pagemap"))?;
    let mut ranges: Vec<[u64; 3]> = Vec::new();
    let mut written = 0;
    let mut entries = vec![0u8; 8 * 4096];
    for line in maps.lines() {
        let line = line?;
        let mut fields = line.split_whitespace();
        let (Some(span), Some(perms)) = (fields.next(), fields.next()) else {
            continue;
        };
        let path = fields.nth(3).unwrap_or("");
        let Some((start, end)) = span.split_once('-').and_then(|(a, b)| {
            Some((
                u64::from_str_radix(a, 16).ok()?,
                u64::from_str_radix(b, 16).ok()?,
            ))
        }) else {
            continue;
        };
        let perms = perms.as_bytes();
        let advice = if perms.starts_with(b"rw") && perms[3] == b'p' {
            POPULATE_WRITE
        } else if perms[0] == b'r' && path.starts_with('/') {
            POPULATE_READ
        } else {
            continue; // inaccessible, shared, or the kernel's ([vdso], [vvar])
        };
        let mut page = start;
        while page < end {
            let count = ((end - page) / PAGE).min(4096) as usize;
            // Short when the mapping went away since `maps` was read (the instance
            // runs on): what was read still counts.
            let read = pagemap.read_at(&mut entries[..8 * count], page / PAGE * 8)?;
            if read < 8 {
                break;
            }
            for (i, entry) in entries[..read].chunks_exact(8).enumerate() {
                let entry = u64::from_le_bytes(entry.try_into().unwrap());
                let wanted =
                    entry & PRESENT != 0 && (advice == POPULATE_READ || entry & EXCLUSIVE != 0);
                if !wanted {
                    continue;
                }
                if advice == POPULATE_WRITE {
                    if written == max_pages {
                        continue;
                    }
                    written += 1;
                }
                let at = page + i as u64 * PAGE;
                match ranges.last_mut() {
                    Some(last) if last[0] + last[1] == at && last[2] == advice => last[1] += PAGE,
                    _ => ranges.push([at, PAGE, advice]),
                }
            }
            page += count as u64 * PAGE;
        }
    }
    Ok(ranges)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_page_this_process_wrote() {
        let page = vec![7u8; 3 * PAGE as usize];
        let ranges = learn(std::process::id() as i32, u64::MAX).unwrap();
        let at = page.as_ptr() as u64 + PAGE;
        assert!(
            ranges
                .iter()
                .any(|r| r[2] == POPULATE_WRITE && r[0] <= at && at < r[0] + r[1]),
            "{at:x} not among {} ranges",
            ranges.len()
        );
        assert!(ranges.iter().any(|r| r[2] == POPULATE_READ));
    }
}
