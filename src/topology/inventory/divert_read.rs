//! Which diverts a fresh read covers, what it asks the broker for them, and what the answers
//! leave to search for (ADR-0084's preflight: every divert that could forward into an address;
//! issue 45: by name where the node's last read found them, `DivertNames` or the divert watch
//! saying whether there is more).

use imbl::OrdMap;
use serde_json::Value;

use super::{DIVERT_ATTRIBUTES, DivertInfo, NodeInventory, bad, matches, parse_divert, strings};
use crate::broker::{BrokerError, JolokiaRequest, mbean};
use crate::topology::divert_watch::{self, Mark};

/// The diverts a scoped read covers.
#[derive(Clone, Copy, Debug, Default)]
pub enum DivertsRead<'a> {
    #[default]
    None,
    /// One divert by name, expected on this source address (a divert's own write).
    Named { name: &'a str, address: &'a str },
    /// Every divert on the node (diverts forwarding into an address live on other addresses),
    /// by one strict pattern read: one operation whatever the number of diverts, and the same
    /// request for every delete in flight, so the deletes a POST carries share one answer
    /// (issue 45).
    All,
    /// Every divert on the node, by its `DivertNames` beside an exact read of each divert its
    /// last poll found (`known`: name and source address; none for a node that had none): the
    /// pattern read's cost grows with every MBean on the node (issue 45, measured on the bed at
    /// 10,000 queues: a queue's read with the pattern 14 ms, with `DivertNames` 4), an exact
    /// read's does not. When the node lists a divert not read where its last poll saw it, every
    /// divert is read by the pattern.
    Listed { known: &'a OrdMap<String, DivertInfo> },
    /// Every divert on the node, by an exact read of each its last full read found (`known`)
    /// beside its divert watch: the watch at `mark` (nothing counted since) makes those every
    /// divert there is, with no `DivertNames` (whose walk of every management object grows
    /// with the node's queues); any other answer reads every divert by the pattern
    /// (topology/divert_watch.rs).
    Watched {
        known: &'a OrdMap<String, DivertInfo>,
        mark: Mark,
    },
}

/// What one request of a divert read asks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum DivertAsk {
    /// The node's `DivertNames`.
    Names,
    /// Every divert, by the pattern.
    Every,
    /// This divert, where it is expected.
    One(String),
    /// The node's divert watch.
    Watch,
}

/// What a divert read asks, each request with what it asks.
pub(super) fn divert_requests(broker_name: &str, read: &DivertsRead<'_>) -> Vec<(DivertAsk, JolokiaRequest)> {
    let names = || {
        let names = JolokiaRequest::read_strict(mbean::broker(broker_name), &["DivertNames"]);
        (DivertAsk::Names, names)
    };
    let one = |name: &str, address: &str| {
        let read = JolokiaRequest::read_strict(mbean::divert(broker_name, address, name), DIVERT_ATTRIBUTES);
        (DivertAsk::One(name.to_string()), read)
    };
    let each = |known: &OrdMap<String, DivertInfo>| -> Vec<_> {
        known.values().map(|d| one(&d.name, &d.address)).collect()
    };
    match read {
        DivertsRead::None => vec![],
        DivertsRead::Named { name, address } => vec![names(), one(name, address)],
        DivertsRead::All => vec![(
            DivertAsk::Every,
            JolokiaRequest::read_strict(mbean::all_diverts(broker_name), DIVERT_ATTRIBUTES),
        )],
        DivertsRead::Listed { known } => std::iter::once(names()).chain(each(known)).collect(),
        DivertsRead::Watched { known, .. } => {
            let watch = (DivertAsk::Watch, divert_watch::request(broker_name));
            std::iter::once(watch).chain(each(known)).collect()
        }
    }
}

/// What a divert read leaves to search for: named diverts not where expected, or every divert
/// (the node lists some where it had none).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum DivertsLeft {
    Named(Vec<String>),
    Every,
}

/// The diverts found from the answers to [`divert_requests`]; for a named read, the names the
/// broker lists that were not where expected come back, to be searched for.
pub(super) fn judge_diverts(
    read: &DivertsRead<'_>,
    answers: Vec<(DivertAsk, Result<Value, BrokerError>)>,
    inv: &mut NodeInventory,
) -> Result<DivertsLeft, BrokerError> {
    let mut listed: Vec<String> = vec![];
    let mut found = std::collections::BTreeSet::new();
    let mut counted_since = false;
    for (ask, answer) in answers {
        match (ask, answer) {
            (DivertAsk::Every, answer) => {
                for v in matches(answer)? {
                    let d = parse_divert(&v).map_err(bad("a divert"))?;
                    inv.diverts.insert(d.name.clone(), d);
                }
            }
            (DivertAsk::Names, Ok(v)) => {
                listed = strings(&v, "DivertNames").map_err(bad("the broker's DivertNames"))?
            }
            (DivertAsk::Names, Err(e)) => return Err(e),
            (DivertAsk::One(_), Ok(v)) => {
                let d = parse_divert(&v).map_err(bad("a divert"))?;
                found.insert(d.name.clone());
                inv.diverts.insert(d.name.clone(), d);
            }
            (DivertAsk::One(_), Err(e)) if e.is_no_such_mbean() => {}
            (DivertAsk::One(_), Err(e)) => return Err(e),
            (DivertAsk::Watch, answer) => {
                let now = divert_watch::judge(answer).mark();
                counted_since = !matches!(read, DivertsRead::Watched { mark, .. } if now == Some(*mark));
            }
        }
    }
    Ok(match read {
        // The divert asked for, when the broker lists it elsewhere.
        DivertsRead::Named { name, .. } => DivertsLeft::Named(
            listed
                .into_iter()
                .filter(|l| l == name && !found.contains(l))
                .collect(),
        ),
        DivertsRead::Listed { .. } if listed.iter().any(|l| !found.contains(l)) => DivertsLeft::Every,
        // A divert added since the mark (or a watch gone or not ours): it could be anywhere.
        DivertsRead::Watched { .. } if counted_since => DivertsLeft::Every,
        _ => DivertsLeft::Named(vec![]),
    })
}
