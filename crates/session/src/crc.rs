//! CRC-32C (Castagnoli), the checksum of log records and checkpoints. Written here rather
//! than taken from a crate so the session crate adds nothing to the workspace's lock file;
//! SSE4.2 computes it in hardware (log records carry values of several MB).

const POLY: u32 = 0x82f6_3b78;

const TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = i as u32;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ POLY
            } else {
                crc >> 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

/// Extends `crc` (0 to start) over `data`.
pub(crate) fn update(crc: u32, data: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("sse4.2") {
        // SAFETY: the CPU has SSE4.2 (checked just above).
        return unsafe { update_sse42(crc, data) };
    }
    update_table(crc, data)
}

fn update_table(crc: u32, data: &[u8]) -> u32 {
    !data.iter().fold(!crc, |crc, &b| {
        TABLE[((crc ^ u32::from(b)) & 0xff) as usize] ^ (crc >> 8)
    })
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
fn update_sse42(crc: u32, data: &[u8]) -> u32 {
    use std::arch::x86_64::{_mm_crc32_u64, _mm_crc32_u8};
    let mut crc = u64::from(!crc);
    let mut words = data.chunks_exact(8);
    for word in &mut words {
        crc = _mm_crc32_u64(crc, u64::from_le_bytes(word.try_into().unwrap()));
    }
    let mut crc = crc as u32;
    for &b in words.remainder() {
        crc = _mm_crc32_u8(crc, b);
    }
    !crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_value_and_paths_agree() {
        assert_eq!(update(0, b"123456789"), 0xe306_9283);
        assert_eq!(update_table(0, b"123456789"), 0xe306_9283);
        let data: Vec<u8> = (0..10_007u32).map(|i| ((i * 7919) >> 3) as u8).collect();
        assert_eq!(update(0, &data), update_table(0, &data));
        let (a, b) = data.split_at(4099);
        assert_eq!(update(update(0, a), b), update(0, &data));
    }
}
