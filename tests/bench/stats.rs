//! Median and spread over repeats.

use serde_json::{Value, json};

#[derive(Debug, Clone, Copy)]
pub struct Summary {
    pub n: usize,
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Summary {
    /// None for no (finite) values.
    pub fn of(values: &[f64]) -> Option<Summary> {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Some(Summary {
            n,
            median,
            min: v[0],
            max: v[n - 1],
        })
    }

    /// `median (min–max, n=…)` with `digits` decimals.
    pub fn show(&self, digits: usize) -> String {
        if self.n == 1 {
            return format!("{:.digits$} (n=1)", self.median);
        }
        format!(
            "{:.digits$} ({:.digits$}–{:.digits$}, n={})",
            self.median, self.min, self.max, self.n
        )
    }

    pub fn json(&self) -> Value {
        json!({"n": self.n, "median": self.median, "min": self.min, "max": self.max})
    }
}

/// A summary shown, or "—" when nothing was measured.
pub fn show(s: Option<Summary>, digits: usize) -> String {
    s.map_or_else(|| "—".to_string(), |s| s.show(digits))
}

pub fn json(s: Option<Summary>) -> Value {
    s.map_or(Value::Null, |s| s.json())
}

/// Element-wise ratio of two series measured in pairs (same repeat).
pub fn ratios(num: &[f64], den: &[f64]) -> Vec<f64> {
    num.iter()
        .zip(den)
        .filter(|(_, d)| **d > 0.0)
        .map(|(n, d)| n / d)
        .collect()
}

/// p50 and p99 of whole-second lags the way ../shared/bench/wait_ready.py takes them: sorted,
/// p50 the element at len/2, p99 the one at ⌊len × 0.99⌋ (at most the last); NaN when empty.
pub fn whole_second_p50_p99(lags: &[i64]) -> (f64, f64) {
    let mut sorted = lags.to_vec();
    sorted.sort_unstable();
    let at = |i: usize| {
        sorted
            .get(i.min(sorted.len().saturating_sub(1)))
            .map_or(f64::NAN, |&s| s as f64)
    };
    (at(sorted.len() / 2), at((sorted.len() as f64 * 0.99) as usize))
}
