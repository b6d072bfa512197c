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

#[cfg(test)]
mod tests {
    use imbl::OrdMap;
    use serde_json::Value;

    use super::{DivertsRead, Mark};
    use crate::broker::BrokerError;
    use crate::topology::divert_watch;
    use crate::topology::inventory::{DivertInfo, NodeInventory, ScopedRead};

    fn divert(name: &str, address: &str, into: &str) -> DivertInfo {
        DivertInfo {
            name: name.into(),
            address: address.into(),
            forwarding_address: into.into(),
            routing_type: "STRIP".into(),
            ..Default::default()
        }
    }

    fn divert_attrs(d: &DivertInfo) -> Value {
        serde_json::json!({"UniqueName": d.name, "Address": d.address, "ForwardingAddress": d.forwarding_address,
            "Exclusive": false, "Filter": null, "RoutingType": d.routing_type, "RoutingName": d.name})
    }

    #[test]
    fn every_divert_is_one_strict_pattern_read_and_none_is_an_empty_answer() {
        let requests = super::divert_requests("b1", &DivertsRead::All);
        assert_eq!(requests.len(), 1, "one operation whatever the number of diverts");
        let request = serde_json::to_value(&requests[0].1).expect("json");
        assert!(request["mbean"].as_str().is_some_and(|m| m.contains("divert=*")));
        assert!(request.get("config").is_none(), "strict: no ignoreErrors");
        // Two diverts answered; then a node without any (Jolokia: 404 for an empty pattern).
        let answer = serde_json::json!({
            "k1": divert_attrs(&divert("d1", "a", "b")),
            "k2": divert_attrs(&divert("tap", "y", "cap")),
        });
        let mut inv = NodeInventory::default();
        let search = super::judge_diverts(
            &DivertsRead::All,
            vec![(super::DivertAsk::Every, Ok(answer))],
            &mut inv,
        )
        .expect("judged");
        assert_eq!(search, super::DivertsLeft::Named(vec![]));
        assert_eq!(inv.diverts.keys().collect::<Vec<_>>(), ["d1", "tap"]);
        let none = BrokerError::NoSuchMBean("javax.management.InstanceNotFoundException".into());
        let mut empty = NodeInventory::default();
        super::judge_diverts(
            &DivertsRead::All,
            vec![(super::DivertAsk::Every, Err(none))],
            &mut empty,
        )
        .expect("judged");
        assert!(empty.diverts.is_empty());
        // Any other failure fails the read: nothing is planned on a guess.
        let refused = BrokerError::BadResponse("AttributeNotFoundException".into());
        assert!(
            super::judge_diverts(
                &DivertsRead::All,
                vec![(super::DivertAsk::Every, Err(refused))],
                &mut empty
            )
            .is_err()
        );
    }

    #[test]
    fn a_named_divert_listed_elsewhere_is_searched_for() {
        let read = DivertsRead::Named {
            name: "d1",
            address: "a",
        };
        let not_found = BrokerError::NoSuchMBean("javax.management.InstanceNotFoundException".into());
        let answers = vec![
            (
                super::DivertAsk::Names,
                Ok(serde_json::json!({"DivertNames": ["d1", "other"]})),
            ),
            (super::DivertAsk::One("d1".into()), Err(not_found)),
        ];
        let mut inv = NodeInventory::default();
        let search = super::judge_diverts(&read, answers, &mut inv).expect("judged");
        assert_eq!(search, super::DivertsLeft::Named(vec!["d1".to_string()]));
    }

    #[test]
    fn a_node_without_diverts_is_asked_their_names_and_read_in_full_only_when_it_lists_some() {
        let no_diverts = OrdMap::new();
        let listed = DivertsRead::Listed { known: &no_diverts };
        let requests = super::divert_requests("b1", &listed);
        let request = serde_json::to_value(&requests[0].1).expect("json");
        assert_eq!(requests.len(), 1);
        assert_eq!(request["attribute"], serde_json::json!(["DivertNames"]));
        assert!(
            request["mbean"].as_str().is_some_and(|m| !m.contains('*')),
            "no pattern"
        );
        let names = |v: Value| {
            vec![(
                super::DivertAsk::Names,
                Ok(serde_json::json!({ "DivertNames": v })),
            )]
        };
        let mut inv = NodeInventory::default();
        let none = super::judge_diverts(&listed, names(serde_json::json!([])), &mut inv);
        assert_eq!(none.expect("judged"), super::DivertsLeft::Named(vec![]));
        let some = super::judge_diverts(&listed, names(serde_json::json!(["new"])), &mut inv);
        assert_eq!(some.expect("judged"), super::DivertsLeft::Every);
        let read = ScopedRead {
            diverts: listed,
            ..Default::default()
        };
        assert!(
            read.covers().diverts,
            "it covers every divert, as the pattern read does"
        );
    }

    /// Issue 45: the diverts a node's last poll found are read by name beside its
    /// `DivertNames`, with no pattern; the pattern read of every divert goes only when the
    /// node lists one that was not where the poll saw it.
    #[test]
    fn diverts_seen_at_the_last_poll_are_read_by_name_and_a_new_one_brings_the_full_read() {
        let known = OrdMap::unit("d1".to_string(), divert("d1", "src", "dst"));
        let listed = DivertsRead::Listed { known: &known };
        let requests = super::divert_requests("b1", &listed);
        assert_eq!(requests.len(), 2, "DivertNames and the known divert");
        assert_eq!(requests[1].0, super::DivertAsk::One("d1".into()));
        for (_, r) in &requests {
            let mbean = serde_json::to_value(r).expect("json")["mbean"].clone();
            assert!(
                mbean.as_str().is_some_and(|m| !m.contains('*')),
                "no pattern: {mbean}"
            );
        }
        let d1 = divert_attrs(&known["d1"]);
        let answers = |names: Value| {
            vec![
                (
                    super::DivertAsk::Names,
                    Ok(serde_json::json!({ "DivertNames": names })),
                ),
                (super::DivertAsk::One("d1".into()), Ok(d1.clone())),
            ]
        };
        let mut inv = NodeInventory::default();
        let same = super::judge_diverts(&listed, answers(serde_json::json!(["d1"])), &mut inv);
        assert_eq!(same.expect("judged"), super::DivertsLeft::Named(vec![]));
        assert_eq!(
            inv.diverts.get("d1").map(|d| d.forwarding_address.as_str()),
            Some("dst")
        );
        let new = super::judge_diverts(&listed, answers(serde_json::json!(["d1", "d2"])), &mut inv);
        assert_eq!(new.expect("judged"), super::DivertsLeft::Every);
    }

    /// Issue 45: with the divert watch at the node's mark, the diverts its last full read found
    /// are read by name with no `DivertNames` and no pattern; the watch counted since (or gone)
    /// brings the pattern read of every divert.
    #[test]
    fn a_watch_at_its_mark_spares_the_divert_names_and_a_count_since_brings_the_full_read() {
        let known = OrdMap::unit("d1".to_string(), divert("d1", "src", "dst"));
        let mark = Mark { id: 9, added: 4 };
        let watched = DivertsRead::Watched { known: &known, mark };
        let requests = super::divert_requests("b1", &watched);
        let asks: Vec<_> = requests.iter().map(|(a, _)| a.clone()).collect();
        assert_eq!(
            asks,
            [super::DivertAsk::Watch, super::DivertAsk::One("d1".into())]
        );
        for (_, r) in &requests {
            let r = serde_json::to_value(r).expect("json");
            assert!(
                r["mbean"].as_str().is_some_and(|m| !m.contains('*')),
                "no pattern"
            );
            assert_ne!(r["attribute"], serde_json::json!(["DivertNames"]));
        }
        let watch = |added: u64| serde_json::json!({"ID": 9, "MessagesAdded": added, "Filter": divert_watch::filter()});
        let d1 = divert_attrs(&known["d1"]);
        let answers = |w: Result<Value, BrokerError>| {
            vec![
                (super::DivertAsk::Watch, w),
                (super::DivertAsk::One("d1".into()), Ok(d1.clone())),
            ]
        };
        let mut inv = NodeInventory::default();
        let same = super::judge_diverts(&watched, answers(Ok(watch(4))), &mut inv);
        assert_eq!(same.expect("judged"), super::DivertsLeft::Named(vec![]));
        assert!(inv.diverts.contains_key("d1"));
        let counted = super::judge_diverts(&watched, answers(Ok(watch(5))), &mut inv);
        assert_eq!(counted.expect("judged"), super::DivertsLeft::Every);
        let gone = Err(BrokerError::NoSuchMBean(
            "javax.management.InstanceNotFoundException".into(),
        ));
        let missing = super::judge_diverts(&watched, answers(gone), &mut inv);
        assert_eq!(missing.expect("judged"), super::DivertsLeft::Every);
        let read = ScopedRead {
            diverts: watched,
            ..Default::default()
        };
        assert!(read.covers().diverts, "it covers every divert");
    }

    /// ADR-0084: a known divert that could not be read (anything but "no such MBean") fails the
    /// read, at the mark or beside `DivertNames`: it is never taken as gone.
    #[test]
    fn a_known_divert_whose_read_failed_fails_the_read_and_is_never_taken_as_gone() {
        let known = OrdMap::unit("d1".to_string(), divert("d1", "src", "dst"));
        let mark = Mark { id: 9, added: 4 };
        let watch = serde_json::json!({"ID": 9, "MessagesAdded": 4, "Filter": divert_watch::filter()});
        let failed = || Err(BrokerError::BadResponse("AttributeNotFoundException".into()));
        let watched = DivertsRead::Watched { known: &known, mark };
        let at_mark = vec![
            (super::DivertAsk::Watch, Ok(watch)),
            (super::DivertAsk::One("d1".into()), failed()),
        ];
        let mut inv = NodeInventory::default();
        assert!(super::judge_diverts(&watched, at_mark, &mut inv).is_err());
        let listed = DivertsRead::Listed { known: &known };
        let beside_names = vec![
            (
                super::DivertAsk::Names,
                Ok(serde_json::json!({"DivertNames": ["d1"]})),
            ),
            (super::DivertAsk::One("d1".into()), failed()),
        ];
        assert!(super::judge_diverts(&listed, beside_names, &mut inv).is_err());
    }
}
