//! How answers are printed: a table for people, JSON lines or a YAML stream for tools. Every
//! document carries its kind; a message carries its origin and the claim it makes, and a
//! captured and a sampled row are never rendered alike (ADR-0062 D10).

use std::io::Write;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;

use super::coverage::{CoverageVerdict, TapCoverage, Window};
use super::requests::{Exchange, LatencyBasis, ReplyVerdict};
use crate::store::captured::LossBound;
use crate::store::reading::{AuditRecord, StoredMessage};

/// What a captured row claims, and no more (ADR-0062 D5, D10).
pub const CAPTURED_CLAIM: &str = "captured: routed to this address (stored by the tap drained on this node); \
     not evidence of delivery to any queue bound there, nor of where the message is now";
/// What a sampled row claims (ADR-0062 D3; ADR-0060's permanent statement).
pub const SAMPLED_CLAIM: &str = "SAMPLED: a browse saw this message on this queue; messages consumed \
     between browses are never seen, so an absence proves nothing";

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Columns for a person.
    #[default]
    Table,
    /// One JSON document per line.
    Json,
    /// A YAML stream (`---` before each document).
    Yaml,
}

/// One message as printed.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MessageDoc<'a> {
    #[serde(flatten)]
    pub row: &'a StoredMessage,
    pub claim: &'static str,
    /// `capture search --verify`: where the message is now, as `capture verify` says it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verified: Option<String>,
}

/// The coverage of a window, per tap, with the subscriptions that only sample.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CoverageDoc {
    pub window: Window,
    /// Every tap complete over the window, and at least one tap.
    pub complete: bool,
    pub taps: Vec<TapCoverage>,
    pub sampled_subscriptions: Vec<String>,
    pub statement: String,
}

impl CoverageDoc {
    pub fn new(window: Window, taps: Vec<TapCoverage>, sampled_subscriptions: Vec<String>) -> Self {
        let complete = !taps.is_empty() && taps.iter().all(|t| t.verdict == CoverageVerdict::Complete);
        let statement = if taps.is_empty() && sampled_subscriptions.is_empty() {
            "nothing was captured in this window: no tap was installed or drained".to_string()
        } else if complete && sampled_subscriptions.is_empty() {
            "complete: every tap drained over the whole window and no loss was counted; every message routed to these addresses on these nodes in the window is here".to_string()
        } else {
            let mut parts = vec![];
            let short = taps
                .iter()
                .filter(|t| t.verdict != CoverageVerdict::Complete)
                .count();
            if short > 0 {
                parts.push(format!(
                    "NOT complete: {short} of {} taps had gaps, loss or no drain in this window (below)",
                    taps.len()
                ));
            }
            if !sampled_subscriptions.is_empty() {
                parts.push(format!(
                    "subscriptions {} only sample: never complete",
                    sampled_subscriptions.join(", ")
                ));
            }
            if parts.is_empty() {
                parts.push("complete for the captured taps".into());
            }
            parts.join("; ")
        };
        CoverageDoc {
            window,
            complete,
            taps,
            sampled_subscriptions,
            statement,
        }
    }
}

/// Every document an answer is made of.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "kind")]
pub enum Document<'a> {
    /// A tail began: what it shows and what it claims.
    TailStarted {
        cluster: String,
        subscription: String,
        mode: String,
        at: DateTime<Utc>,
        claim: &'static str,
    },
    Message(MessageDoc<'a>),
    Coverage(CoverageDoc),
    Exchange(&'a Exchange),
    Audit(&'a AuditRecord),
    Verification(&'a Verification),
    /// More rows match: ask again with `--after`.
    NextPage {
        #[serde(rename = "after")]
        after_row: i64,
    },
}

fn time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

fn clip(s: &str, width: usize) -> String {
    let flat: String = s.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    if flat.chars().count() <= width {
        flat
    } else {
        let mut out: String = flat.chars().take(width.saturating_sub(1)).collect();
        out.push('…');
        out
    }
}

fn short_node(node: &str) -> String {
    node.chars().take(8).collect()
}

fn body(row: &StoredMessage) -> String {
    let shown = if row.body_binary {
        format!("<binary, {} bytes>", row.body_size)
    } else {
        row.body_text.clone().unwrap_or_default()
    };
    if row.body_truncated {
        format!("{shown} [cut, {} bytes]", row.body_size)
    } else {
        shown
    }
}

/// Prints documents in one format; the table heads are written once.
pub struct Printer<W: Write> {
    out: W,
    format: Format,
    message_head: bool,
}

impl<W: Write> Printer<W> {
    pub fn new(out: W, format: Format) -> Self {
        Printer {
            out,
            format,
            message_head: false,
        }
    }

    pub fn into_inner(self) -> W {
        self.out
    }

    pub fn print(&mut self, doc: &Document<'_>) -> std::io::Result<()> {
        match self.format {
            Format::Json => {
                serde_json::to_writer(&mut self.out, doc)?;
                writeln!(self.out)?;
            }
            Format::Yaml => {
                let text = serde_saphyr::to_string(doc).map_err(std::io::Error::other)?;
                write!(self.out, "---\n{text}")?;
            }
            Format::Table => self.table(doc)?,
        }
        self.out.flush()
    }

    /// One document as table lines: a message, exchange or audit row under its column heads.
    fn table(&mut self, doc: &Document<'_>) -> std::io::Result<()> {
        match doc {
            Document::TailStarted {
                cluster,
                subscription,
                mode,
                at,
                ..
            } => tail_started_lines(&mut self.out, cluster, subscription, mode, *at),
            Document::Message(m) => {
                let (body, verified) = match m.verified {
                    Some(_) => (format!("{:<60}", "BODY"), " VERIFIED"),
                    None => ("BODY".to_string(), ""),
                };
                self.head_once(format_args!(
                    "{:<8} {:<24} {:<9} {:<20} {:<8} {:<24} {:<14} {:<30} {body}{verified}",
                    "ROW", "AT", "ORIGIN", "SUBSCRIPTION", "NODE", "ADDRESS", "CORRELATION", "PROPERTIES"
                ))?;
                message_line(&mut self.out, m.row, m.verified.as_deref())
            }
            Document::Coverage(c) => coverage_lines(&mut self.out, c),
            Document::Exchange(x) => {
                self.head_once(format_args!(
                    "{:<8} {:<24} {:<22} {:<24} {:<8} REASON",
                    "REQUEST", "AT", "VERDICT", "REPLY TO", "LATENCY"
                ))?;
                exchange_line(&mut self.out, x)
            }
            Document::Audit(a) => {
                self.head_once(format_args!(
                    "{:<6} {:<24} {:<22} {:<30} {:<10} {:<20} NODES",
                    "ID", "AT", "COMMAND", "TARGET", "OUTCOME", "ACTOR"
                ))?;
                audit_line(&mut self.out, a)
            }
            Document::Verification(v) => verification_lines(&mut self.out, v),
            Document::NextPage { after_row } => {
                writeln!(self.out, "# more rows match: ask again with --after {after_row}")
            }
        }
    }

    /// The column heads, before the first row only (one answer prints one kind of row).
    fn head_once(&mut self, head: std::fmt::Arguments<'_>) -> std::io::Result<()> {
        if !self.message_head {
            self.message_head = true;
            writeln!(self.out, "{head}")?;
        }
        Ok(())
    }
}

/// One queue's answer on one node.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueAnswer {
    pub node: String,
    pub queue: Option<String>,
    /// waiting, delivering, scheduled, absent — or could-not-ask.
    pub state: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

/// What `capture verify` found, for one row (issue 48).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Verification {
    pub row: i64,
    pub address: String,
    pub message_id: Option<String>,
    pub answers: Vec<QueueAnswer>,
    /// The conclusion, never more than the answers show.
    pub verdict: String,
}

/// A verification: the row, each node's and queue's answer, the verdict.
fn verification_lines(o: &mut impl Write, v: &Verification) -> std::io::Result<()> {
    let id = v.message_id.as_deref().unwrap_or("none");
    writeln!(o, "row {} on {} (message id {id})", v.row, v.address)?;
    writeln!(o, "{:<40} {:<40} {:<14} WHY", "NODE", "QUEUE", "STATE")?;
    for a in &v.answers {
        let (queue, why) = (a.queue.as_deref().unwrap_or("-"), a.why.as_deref().unwrap_or(""));
        writeln!(o, "{:<40} {:<40} {:<14} {why}", a.node, queue, a.state)?;
    }
    writeln!(o, "{}", v.verdict)
}

/// What a tail shows, and the claim its rows make.
fn tail_started_lines(
    o: &mut impl Write,
    cluster: &str,
    subscription: &str,
    mode: &str,
    at: DateTime<Utc>,
) -> std::io::Result<()> {
    writeln!(o, "tailing {subscription} (cluster {cluster}) from {}", time(at))?;
    if mode == "sample" {
        writeln!(o, "# {SAMPLED_CLAIM}")?;
    } else {
        writeln!(o, "# {CAPTURED_CLAIM}")?;
    }
    Ok(())
}

/// One message under the heads: the subscription that stored it too, so a message two
/// subscriptions both capture shows as two rows told apart (issue 42). A listing covers one
/// ArtemisCluster, so one namespace: the subscription's name says which.
fn message_line(o: &mut impl Write, r: &StoredMessage, verified: Option<&str>) -> std::io::Result<()> {
    // A sampled row is marked in its origin and its row number (ADR-0062 D10).
    let (row, origin) = if r.sampled() {
        (format!("~{}", r.row_id), "~SAMPLED")
    } else {
        (r.row_id.to_string(), "captured")
    };
    writeln!(
        o,
        "{:<8} {:<24} {:<9} {:<20} {:<8} {:<24} {:<14} {:<30} {}",
        row,
        time(r.captured_at),
        origin,
        clip(&r.subscription, 20),
        short_node(&r.node),
        clip(&r.original_address, 24),
        clip(r.correlation_id.as_deref().unwrap_or("-"), 14),
        clip(&r.properties.to_string(), 30),
        match verified {
            Some(v) => format!("{:<60} {v}", clip(&body(r), 60)),
            None => clip(&body(r), 60),
        }
    )
}

/// The window's statement, a line per tap, and the claims of the rows it covers.
fn coverage_lines(o: &mut impl Write, c: &CoverageDoc) -> std::io::Result<()> {
    writeln!(
        o,
        "coverage {} → {}: {}",
        time(c.window.from),
        time(c.window.to),
        c.statement
    )?;
    for t in &c.taps {
        writeln!(
            o,
            "  {:<20} {:<8} {:<24} {:<12} {}",
            clip(&t.subscription, 20),
            short_node(&t.node),
            clip(&t.address, 24),
            t.verdict.label(),
            tap_notes(t, c.window).join("; ")
        )?;
    }
    if !c.sampled_subscriptions.is_empty() {
        writeln!(o, "# {SAMPLED_CLAIM}")?;
    }
    if !c.taps.is_empty() {
        writeln!(o, "# {CAPTURED_CLAIM}")?;
    }
    Ok(())
}

/// A tap's gaps (a gap from the window's start to the first drain is "not drained before"),
/// then its estimated losses.
fn tap_notes(t: &TapCoverage, window: Window) -> Vec<String> {
    let mut notes: Vec<String> = t
        .gaps
        .iter()
        .map(|g| {
            if g.from == window.from && t.first_drained.is_some_and(|f| f >= g.to) {
                format!("not drained before {}", time(g.to))
            } else {
                format!(
                    "gap {} → {} ({}s)",
                    time(g.from),
                    time(g.to),
                    (g.to - g.from).num_seconds()
                )
            }
        })
        .collect();
    notes.extend(t.lost.iter().map(|l| {
        // An exact count is "=", an upper bound "≤", a lower bound "≥", an estimate "≈".
        let (sign, bound) = match l.bound {
            Some(b @ LossBound::Exact) => ("=", format!("{}; ", b.label())),
            Some(b @ LossBound::UpperBound) => ("≤", format!("{}; ", b.label())),
            Some(b @ LossBound::LowerBound) => ("≥", format!("{}; ", b.label())),
            None => ("≈", String::new()),
        };
        format!(
            "lost{sign}{} {} ({bound}last grew {}{})",
            l.messages,
            l.cause,
            time(l.last_grew_at),
            if l.in_window { ", in this window" } else { "" }
        )
    }));
    notes
}

fn exchange_line(o: &mut impl Write, x: &Exchange) -> std::io::Result<()> {
    let verdict = match x.verdict {
        ReplyVerdict::Replied => "REPLIED",
        ReplyVerdict::NoReplyCaptured => "NO_REPLY_CAPTURED",
        ReplyVerdict::ReplyNotCapturable => "REPLY_NOT_CAPTURABLE",
    };
    let latency = match (x.latency_ms, x.latency_basis) {
        (Some(ms), Some(LatencyBasis::Routed)) => format!("{ms}ms"),
        (Some(ms), _) => format!("~{ms}ms"),
        (None, _) => "-".to_string(),
    };
    writeln!(
        o,
        "{:<8} {:<24} {:<22} {:<24} {:<8} {}",
        x.request_row,
        time(x.requested_at),
        verdict,
        clip(&x.reply_to, 24),
        latency,
        x.reason
    )
}

fn audit_line(o: &mut impl Write, a: &AuditRecord) -> std::io::Result<()> {
    writeln!(
        o,
        "{:<6} {:<24} {:<22} {:<30} {:<10} {:<20} {}",
        a.id,
        time(a.occurred_at),
        clip(&a.command, 22),
        clip(&a.target, 30),
        a.outcome,
        clip(&a.actor, 20),
        node_outcomes(a)
    )
}

/// `node=OUTCOME(refusal)` per node of an audit row, or its reason when it has no nodes.
pub fn node_outcomes(a: &AuditRecord) -> String {
    let Some(detail) = &a.outcome_detail else {
        return "-".into();
    };
    if let Some(nodes) = detail.get("nodes").and_then(|n| n.as_array()) {
        return nodes
            .iter()
            .map(|n| {
                let node = n.get("node").and_then(|v| v.as_str()).unwrap_or("?");
                let outcome = n.get("outcome").and_then(|v| v.as_str()).unwrap_or("?");
                match n.get("refusal").and_then(|v| v.as_str()) {
                    Some(r) => format!("{}={outcome}({r})", short_node(node)),
                    None => format!("{}={outcome}", short_node(node)),
                }
            })
            .collect::<Vec<_>>()
            .join(" ");
    }
    detail
        .get("reason")
        .and_then(|r| r.as_str())
        .map_or_else(|| detail.to_string(), str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(origin: &str) -> StoredMessage {
        StoredMessage {
            row_id: 7,
            cluster: "ns/c".into(),
            subscription: "s".into(),
            node: "0123456789".into(),
            original_address: "orders".into(),
            capture_queue: "q".into(),
            source_message_id: None,
            message_id: None,
            correlation_id: None,
            reply_to: None,
            properties: serde_json::json!({"region": "eu"}),
            headers: serde_json::json!({}),
            body_text: Some("hello".into()),
            body_binary: false,
            body_size: 5,
            body_truncated: false,
            routed_at: None,
            captured_at: DateTime::from_timestamp(1_800_000_000, 0).expect("time"),
            origin: origin.into(),
        }
    }

    fn printed(format: Format, r: &StoredMessage) -> String {
        let claim = if r.sampled() {
            SAMPLED_CLAIM
        } else {
            CAPTURED_CLAIM
        };
        let mut p = Printer::new(vec![], format);
        p.print(&Document::Message(MessageDoc {
            row: r,
            claim,
            verified: None,
        }))
        .expect("print");
        String::from_utf8(p.into_inner()).expect("utf8")
    }

    #[test]
    fn a_sampled_row_is_never_rendered_like_a_captured_one_in_any_format() {
        let (c, s) = (row("captured"), row("sampled"));
        for format in [Format::Table, Format::Json, Format::Yaml] {
            let (pc, ps) = (printed(format, &c), printed(format, &s));
            assert_ne!(pc, ps, "{format:?}");
            assert!(ps.contains("SAMPLED"), "{format:?}: {ps}");
            assert!(!pc.contains("SAMPLED"), "{format:?}: {pc}");
        }
        let json: serde_json::Value =
            serde_json::from_str(printed(Format::Json, &s).trim()).expect("json line");
        assert_eq!(json["kind"], "Message");
        assert_eq!(json["origin"], "sampled");
        assert_eq!(json["claim"], SAMPLED_CLAIM);
        assert!(printed(Format::Table, &s).contains("~7"));
    }

    /// Issue 42: two subscriptions capturing the same address store each message twice; the
    /// table tells the two rows apart by their subscription, under its own head, and the JSON
    /// and YAML documents carry it (and the cluster, whose namespace it is in).
    #[test]
    fn each_message_row_names_its_subscription_in_every_format() {
        let mut a = row("captured");
        a.subscription = "orders-audit".into();
        let mut b = a.clone();
        b.row_id = 8;
        b.subscription = "everything".into();
        let mut p = Printer::new(vec![], Format::Table);
        for r in [&a, &b] {
            p.print(&Document::Message(MessageDoc {
                row: r,
                claim: CAPTURED_CLAIM,
                verified: None,
            }))
            .expect("print");
        }
        let table = String::from_utf8(p.into_inner()).expect("utf8");
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3, "{table}");
        let column = lines[0].find("SUBSCRIPTION").expect("a SUBSCRIPTION head");
        assert_eq!(lines[1].get(column..column + 12), Some("orders-audit"), "{table}");
        assert_eq!(lines[2].get(column..column + 10), Some("everything"), "{table}");
        // The rest of the two rows (their number aside) is the same message.
        let (first, second) = (&lines[1][column + 20..], &lines[2][column + 20..]);
        assert_eq!(first, second, "{table}");

        let json: serde_json::Value =
            serde_json::from_str(printed(Format::Json, &a).trim()).expect("json line");
        assert_eq!(
            (&json["subscription"], &json["cluster"]),
            (&serde_json::json!("orders-audit"), &serde_json::json!("ns/c"))
        );
        let yaml: serde_json::Value = serde_saphyr::from_str(
            printed(Format::Yaml, &a)
                .strip_prefix("---\n")
                .expect("a YAML document"),
        )
        .expect("yaml");
        assert_eq!(yaml["subscription"], "orders-audit");
        assert_eq!(yaml["cluster"], "ns/c");
    }

    #[test]
    fn a_gap_before_the_first_drain_reads_as_not_drained_and_later_ones_as_gaps() {
        let t = |s: i64| DateTime::from_timestamp(1_800_000_000 + s, 0).expect("time");
        let window = Window {
            from: t(0),
            to: t(100),
        };
        let tap = TapCoverage {
            subscription: "s".into(),
            node: "n1".into(),
            address: "a".into(),
            verdict: CoverageVerdict::Gaps,
            gaps: vec![
                Window {
                    from: t(0),
                    to: t(10),
                },
                Window {
                    from: t(40),
                    to: t(70),
                },
            ],
            first_drained: Some(t(10)),
            lost: vec![crate::reading::coverage::Loss {
                cause: "ring_overwrite".into(),
                messages: 3,
                last_grew_at: t(50),
                in_window: true,
                bound: None,
            }],
        };
        assert_eq!(
            tap_notes(&tap, window),
            vec![
                format!("not drained before {}", time(t(10))),
                format!("gap {} → {} (30s)", time(t(40)), time(t(70))),
                format!(
                    "lost≈3 ring_overwrite (last grew {}, in this window)",
                    time(t(50))
                ),
            ]
        );
    }

    #[test]
    fn a_loss_says_which_bound_it_is() {
        let t = |s: i64| DateTime::from_timestamp(1_800_000_000 + s, 0).expect("time");
        let window = Window {
            from: t(0),
            to: t(100),
        };
        let loss = |cause: &str, bound| crate::reading::coverage::Loss {
            cause: cause.into(),
            messages: 40,
            last_grew_at: t(50),
            in_window: true,
            bound,
        };
        let tap = TapCoverage {
            subscription: "s".into(),
            node: "n1".into(),
            address: "a".into(),
            verdict: CoverageVerdict::Lossy,
            gaps: vec![],
            first_drained: Some(t(0)),
            lost: vec![
                loss("failover_window", Some(LossBound::Exact)),
                loss("tap_missing", Some(LossBound::UpperBound)),
                loss("failover_window", Some(LossBound::LowerBound)),
            ],
        };
        let at = time(t(50));
        assert_eq!(
            tap_notes(&tap, window),
            vec![
                format!("lost=40 failover_window (exact; last grew {at}, in this window)"),
                format!("lost≤40 tap_missing (upper bound; last grew {at}, in this window)"),
                format!("lost≥40 failover_window (lower bound; last grew {at}, in this window)"),
            ]
        );
    }
}
