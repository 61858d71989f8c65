//! A closed-loop HTTP/1.1 client over a Unix socket (XFaaS §4.2: each client sends its
//! next request as soon as the previous answer arrives). One thread and one keep-alive
//! connection per client; std only, so it costs the 2-core machine little next to the
//! daemon it measures.
//!
//! Usage: closed_loop SOCKET PATH BODY CLIENTS SECS [HEADER: VALUE]...
//! Prints one JSON line: requests, errors (non-200 or a body starting "error"), throughput,
//! mean/p50/p99 latency in ms. The first 0.5 s of each run is warm-up and not counted.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

const WARMUP: Duration = Duration::from_millis(500);

/// Reads one response: (status, body). Handles Content-Length and chunked bodies.
fn response(r: &mut BufReader<UnixStream>) -> std::io::Result<(u16, Vec<u8>)> {
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status: u16 = line.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let (mut length, mut chunked) = (0usize, false);
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let (k, v) = l.split_once(':').unwrap_or((l, ""));
        if k.eq_ignore_ascii_case("content-length") {
            length = v.trim().parse().unwrap_or(0);
        } else if k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked") {
            chunked = true;
        }
    }
    let mut body = Vec::new();
    if chunked {
        loop {
            line.clear();
            r.read_line(&mut line)?;
            let n = usize::from_str_radix(line.trim(), 16).unwrap_or(0);
            let mut chunk = vec![0; n + 2];
            r.read_exact(&mut chunk)?;
            if n == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..n]);
        }
    } else {
        body.resize(length, 0);
        r.read_exact(&mut body)?;
    }
    Ok((status, body))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 6 {
        eprintln!("usage: closed_loop SOCKET PATH BODY CLIENTS SECS [HEADER: VALUE]...");
        std::process::exit(2);
    }
    let (socket, path, body) = (args[1].clone(), &args[2], &args[3]);
    let clients: usize = args[4].parse().expect("CLIENTS");
    let secs: f64 = args[5].parse().expect("SECS");
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nhost: skiff\r\ncontent-length: {}\r\n",
        body.len()
    );
    for h in &args[6..] {
        request += &format!("{h}\r\n");
    }
    request += "\r\n";
    request += body;
    let request = Arc::new(request.into_bytes());

    let start = Instant::now() + Duration::from_millis(50);
    let (from, to) = (start + WARMUP, start + WARMUP + Duration::from_secs_f64(secs));
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            let (socket, request) = (socket.clone(), request.clone());
            thread::spawn(move || {
                let mut stream = UnixStream::connect(&socket).expect("connect");
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let (mut us, mut errors, mut sample) = (Vec::new(), 0u64, None);
                thread::sleep(start.saturating_duration_since(Instant::now()));
                loop {
                    let t = Instant::now();
                    if t >= to {
                        break;
                    }
                    stream.write_all(&request).expect("write");
                    let (status, body) = response(&mut reader).expect("read");
                    let done = Instant::now();
                    if t >= from {
                        us.push((done - t).as_micros() as u64);
                        if status != 200 || body.starts_with(b"error") {
                            errors += 1;
                            sample.get_or_insert_with(|| {
                                format!("{status} {}", String::from_utf8_lossy(&body))
                            });
                        }
                    }
                }
                (us, errors, sample)
            })
        })
        .collect();
    let (mut us, mut errors, mut sample) = (Vec::new(), 0, None);
    for t in threads {
        let (u, e, s) = t.join().expect("client thread");
        us.extend(u);
        errors += e;
        sample = sample.or(s);
    }
    us.sort_unstable();
    let n = us.len().max(1);
    let q = |p: f64| us.get(((n as f64 * p) as usize).min(n - 1)).copied().unwrap_or(0) as f64 / 1e3;
    let mean = us.iter().sum::<u64>() as f64 / n as f64 / 1e3;
    let sample = sample.unwrap_or_default().replace(['"', '\\', '\n'], " ");
    println!(
        "{{\"clients\":{clients},\"requests\":{},\"errors\":{errors},\"rps\":{:.1},\"mean_ms\":{mean:.3},\"p50_ms\":{:.3},\"p99_ms\":{:.3},\"error_sample\":\"{}\"}}",
        us.len(),
        us.len() as f64 / secs,
        q(0.5),
        q(0.99),
        sample.chars().take(200).collect::<String>()
    );
}
