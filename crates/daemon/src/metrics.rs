//! `/metrics` in Prometheus text: invocations and errors by function and status class,
//! latency histograms, cold starts and their time (the numbers OpenFaaS and Knative users
//! keep asking for), functions deployed, invocations in flight.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64};
use std::sync::Mutex;
use std::time::Duration;

/// Histogram bounds in seconds.
const BUCKETS: [f64; 11] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0, 30.0,
];

#[derive(Default)]
pub struct Metrics {
    pub inflight: AtomicI64,
    /// Session pools opened: new sessions and restores.
    pub sessions_opened: AtomicU64,
    pub session_checkpoints: AtomicU64,
    pub session_checkpoint_failures: AtomicU64,
    by_function: Mutex<BTreeMap<String, PerFunction>>,
}

#[derive(Default)]
struct PerFunction {
    by_status: BTreeMap<&'static str, u64>,
    latency: Histogram,
    cold_starts: Histogram,
}

#[derive(Default)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    fn observe(&mut self, d: Duration) {
        let s = d.as_secs_f64();
        for (i, bound) in BUCKETS.iter().enumerate() {
            if s <= *bound {
                self.counts[i] += 1;
            }
        }
        self.count += 1;
        self.sum += s;
    }

    fn render(&self, out: &mut String, name: &str, function: &str) {
        for (bound, n) in BUCKETS.iter().zip(self.counts) {
            let _ = writeln!(
                out,
                "{name}_bucket{{function=\"{function}\",le=\"{bound}\"}} {n}"
            );
        }
        let _ = writeln!(
            out,
            "{name}_bucket{{function=\"{function}\",le=\"+Inf\"}} {}",
            self.count
        );
        let _ = writeln!(out, "{name}_sum{{function=\"{function}\"}} {}", self.sum);
        let _ = writeln!(
            out,
            "{name}_count{{function=\"{function}\"}} {}",
            self.count
        );
    }
}

impl Metrics {
    pub fn record(
        &self,
        function: &str,
        status: u16,
        took: Duration,
        cold_start: Option<Duration>,
    ) {
        let class = match status {
            200..=299 => "2xx",
            400..=499 => "4xx",
            _ => "5xx",
        };
        let mut all = self.by_function.lock().unwrap_or_else(|e| e.into_inner());
        let f = all.entry(function.to_owned()).or_default();
        *f.by_status.entry(class).or_default() += 1;
        f.latency.observe(took);
        if let Some(start) = cold_start {
            f.cold_starts.observe(start);
        }
    }

    /// `gauges`: per function, (name, instances or sandboxes running, requests queued).
    /// `sessions`: sessions live and their workers.
    pub fn render(
        &self,
        functions: usize,
        gauges: &[(String, usize, usize)],
        sessions: (usize, usize),
    ) -> String {
        let mut out = String::new();
        let all = self.by_function.lock().unwrap_or_else(|e| e.into_inner());
        out.push_str("# HELP skiff_functions Functions deployed.\n# TYPE skiff_functions gauge\n");
        let _ = writeln!(out, "skiff_functions {functions}");
        out.push_str("# HELP skiff_invocations_in_flight Invocations running now.\n# TYPE skiff_invocations_in_flight gauge\n");
        let _ = writeln!(
            out,
            "skiff_invocations_in_flight {}",
            self.inflight.load(std::sync::atomic::Ordering::Relaxed)
        );
        out.push_str("# HELP skiff_instances Instances (or binary sandboxes) running per function.\n# TYPE skiff_instances gauge\n");
        for (name, running, _) in gauges {
            let _ = writeln!(out, "skiff_instances{{function=\"{name}\"}} {running}");
        }
        out.push_str("# HELP skiff_queue_depth Requests waiting for an instance per function.\n# TYPE skiff_queue_depth gauge\n");
        for (name, _, queued) in gauges {
            let _ = writeln!(out, "skiff_queue_depth{{function=\"{name}\"}} {queued}");
        }
        out.push_str("# HELP skiff_invocations_total Invocations by function and status class.\n# TYPE skiff_invocations_total counter\n");
        for (name, f) in all.iter() {
            for (class, n) in &f.by_status {
                let _ = writeln!(
                    out,
                    "skiff_invocations_total{{function=\"{name}\",status=\"{class}\"}} {n}"
                );
            }
        }
        out.push_str("# HELP skiff_invocation_seconds Time from request to response.\n# TYPE skiff_invocation_seconds histogram\n");
        for (name, f) in all.iter() {
            f.latency.render(&mut out, "skiff_invocation_seconds", name);
        }
        out.push_str("# HELP skiff_cold_starts_total Invocations that paid a cold start.\n# TYPE skiff_cold_starts_total counter\n");
        for (name, f) in all.iter() {
            let _ = writeln!(
                out,
                "skiff_cold_starts_total{{function=\"{name}\"}} {}",
                f.cold_starts.count
            );
        }
        out.push_str("# HELP skiff_cold_start_seconds Time to start an instance, paid by the invocation that found none idle (every binary invocation is a cold start).\n# TYPE skiff_cold_start_seconds histogram\n");
        for (name, f) in all.iter() {
            f.cold_starts
                .render(&mut out, "skiff_cold_start_seconds", name);
        }
        let counter = |n: &AtomicU64| n.load(std::sync::atomic::Ordering::Relaxed);
        for (name, kind, help, value) in [
            (
                "skiff_sessions",
                "gauge",
                "Sessions with workers running.",
                sessions.0 as u64,
            ),
            (
                "skiff_session_workers",
                "gauge",
                "Wasm workers of sessions, primaries and secondaries.",
                sessions.1 as u64,
            ),
            (
                "skiff_sessions_opened_total",
                "counter",
                "Sessions started: new ones and restores from a checkpoint.",
                counter(&self.sessions_opened),
            ),
            (
                "skiff_session_checkpoints_total",
                "counter",
                "Session checkpoints written.",
                counter(&self.session_checkpoints),
            ),
            (
                "skiff_session_checkpoint_failures_total",
                "counter",
                "Session checkpoints that failed.",
                counter(&self.session_checkpoint_failures),
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
            );
        }
        out
    }
}
