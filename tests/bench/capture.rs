//! Scenario 3, capture: NOT BUILT. It needs the drain into Postgres (capture part 2), which
//! does not exist yet; what it will measure is issue 16's list below.

use serde_json::json;

use crate::report::Section;

/// STUB: the drain exists now; this scenario is not written yet.
pub fn stub() -> Section {
    let mut s = Section::new(
        "capture",
        "3. Capture (stub)",
        "**Not measured yet: this scenario is a stub.** It is to measure producer throughput (1 KiB, one producer) on an address with no tap vs. with a tap (target ≥ 0.9), ingest into Postgres vs. a bare AMQP consumer that discards on the same capture queue (target ≥ 0.8), and loss reported vs. actual when the rate cap or the ring bites.",
    );
    s.json = json!({"status": "not built", "reason": "scenario not written yet"});
    s
}
