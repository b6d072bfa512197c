//! The typed management surface of one broker (ActiveMQServerControl and friends), over Jolokia.

use serde::Deserialize;
use serde_json::{Value, json};

use super::error::BrokerError;
use super::jolokia::{JolokiaClient, JolokiaRequest};
use super::mbean;

/// One broker process's management, with its broker name resolved.
#[derive(Clone, Debug)]
pub struct BrokerManagement {
    client: JolokiaClient,
    broker_name: String,
}

/// Who this endpoint is now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeIdentity {
    pub broker_name: String,
    pub node_id: String,
    /// Serving clients now (a primary, or a backup after failover).
    pub active: bool,
    /// Configured as a backup (HA policy), whether or not it has failed over. The broker's
    /// `Backup` attribute turns false once a backup is promoted; its HA policy does not.
    pub configured_backup: bool,
    /// The cluster members this node sees (`listNetworkTopology`).
    pub topology: Vec<TopologyMember>,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct TopologyMember {
    #[serde(rename = "nodeID")]
    pub node_id: String,
    /// host:port of the member's live (active) server.
    #[serde(default)]
    pub live: Option<String>,
    #[serde(default)]
    pub primary: Option<String>,
    #[serde(default)]
    pub backup: Option<String>,
}

fn bool_value(v: &Value) -> Result<bool, BrokerError> {
    v.as_bool()
        .ok_or_else(|| BrokerError::BadResponse(format!("expected a boolean, got {v}")))
}

fn string_value(v: &Value) -> Result<String, BrokerError> {
    v.as_str()
        .map(str::to_string)
        .ok_or_else(|| BrokerError::BadResponse(format!("expected a string, got {v}")))
}

/// Parse `listNetworkTopology()`'s JSON string.
pub fn parse_topology(v: &Value) -> Result<Vec<TopologyMember>, BrokerError> {
    let s = v
        .as_str()
        .ok_or_else(|| BrokerError::BadResponse("listNetworkTopology did not return a string".into()))?;
    serde_json::from_str(s).map_err(|e| BrokerError::BadResponse(format!("listNetworkTopology: {e}")))
}

impl BrokerManagement {
    /// Resolve the broker name behind an endpoint (never assumed: read it).
    pub async fn connect(client: JolokiaClient) -> Result<Self, BrokerError> {
        let found = client
            .call(JolokiaRequest::search(mbean::broker_search_pattern()))
            .await?;
        let names: Vec<String> = found
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|n| n.as_str().and_then(mbean::broker_name_of))
                    .collect()
            })
            .unwrap_or_default();
        match names.as_slice() {
            [one] => Ok(BrokerManagement {
                client,
                broker_name: one.clone(),
            }),
            [] => Err(BrokerError::BadResponse(format!(
                "{} serves no Artemis broker MBean: is this an Artemis broker's Jolokia?",
                client.url()
            ))),
            many => Err(BrokerError::BadResponse(format!(
                "{} serves several brokers: {many:?}",
                client.url()
            ))),
        }
    }

    pub fn with_name(client: JolokiaClient, broker_name: String) -> Self {
        BrokerManagement { client, broker_name }
    }

    pub fn broker_name(&self) -> &str {
        &self.broker_name
    }

    pub fn client(&self) -> &JolokiaClient {
        &self.client
    }

    /// The same broker through another client of the same endpoint (a probing, working or
    /// tracked variant of this one's).
    pub fn with_client(&self, client: JolokiaClient) -> Self {
        BrokerManagement {
            client,
            broker_name: self.broker_name.clone(),
        }
    }

    /// The same broker, telling whether any call made through it went on the wire (see
    /// [`super::jolokia::Sent`]).
    pub fn tracked(&self) -> (Self, super::jolokia::Sent) {
        let (client, sent) = self.client.tracked();
        (self.with_client(client), sent)
    }

    fn broker(&self) -> String {
        mbean::broker(&self.broker_name)
    }

    async fn exec(&self, operation: &str, arguments: Vec<Value>) -> Result<Value, BrokerError> {
        self.client
            .call(JolokiaRequest::exec(self.broker(), operation, arguments))
            .await
    }

    /// NodeID, Active, Backup, HAPolicy and the topology this node sees: one bulk request.
    pub async fn identity(&self) -> Result<NodeIdentity, BrokerError> {
        let b = self.broker();
        let mut r = self
            .client
            .bulk(&[
                JolokiaRequest::read(b.clone(), "NodeID"),
                JolokiaRequest::read(b.clone(), "Active"),
                JolokiaRequest::read(b.clone(), "Backup"),
                JolokiaRequest::read(b.clone(), "HAPolicy"),
                JolokiaRequest::exec(b, "listNetworkTopology()", vec![]),
            ])
            .await?
            .into_iter();
        let mut next = || {
            r.next()
                .unwrap_or_else(|| Err(BrokerError::BadResponse("short bulk response".into())))
        };
        let node_id = string_value(&next()?)?;
        let active = bool_value(&next()?)?;
        let backup = bool_value(&next()?)?;
        let ha_policy = next()
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        // A backup that is not active may refuse or return an empty topology; that is not fatal.
        let topology = next()
            .ok()
            .map(|v| parse_topology(&v))
            .transpose()?
            .unwrap_or_default();
        Ok(NodeIdentity {
            broker_name: self.broker_name.clone(),
            node_id,
            active,
            configured_backup: backup || ha_policy.contains("Backup"),
            topology,
        })
    }

    /// `createQueue(String json, boolean ignoreIfExists)`: returns the created configuration.
    pub async fn create_queue(&self, configuration: &Value) -> Result<Value, BrokerError> {
        self.exec(
            "createQueue(java.lang.String,boolean)",
            vec![json!(configuration.to_string()), json!(false)],
        )
        .await
    }

    /// `createAddress` then `createQueue`, in one POST and in this order: a queue on an address
    /// the broker does not have yet costs one round trip (issue 23). One result each.
    pub async fn create_address_and_queue(
        &self,
        address: &str,
        routing_types: &str,
        configuration: &Value,
    ) -> (Result<(), BrokerError>, Result<Value, BrokerError>) {
        let b = self.broker();
        let mut results = self
            .client
            .call_together(vec![
                JolokiaRequest::exec(
                    b.clone(),
                    "createAddress(java.lang.String,java.lang.String)",
                    vec![json!(address), json!(routing_types)],
                ),
                JolokiaRequest::exec(
                    b,
                    "createQueue(java.lang.String,boolean)",
                    vec![json!(configuration.to_string()), json!(false)],
                ),
            ])
            .await
            .into_iter();
        let missing = || {
            Err(BrokerError::BadResponse(
                "no answer for this element of the bulk request".into(),
            ))
        };
        let address = results.next().unwrap_or_else(missing).map(|_| ());
        let queue = results.next().unwrap_or_else(missing);
        (address, queue)
    }

    /// `updateQueue(String json)`: replaces the configuration (send the whole document).
    pub async fn update_queue(&self, configuration: &Value) -> Result<Value, BrokerError> {
        self.exec(
            "updateQueue(java.lang.String)",
            vec![json!(configuration.to_string())],
        )
        .await
    }

    /// `destroyQueue(name, removeConsumers, forceAutoDeleteAddress=false)`.
    pub async fn destroy_queue(&self, name: &str, remove_consumers: bool) -> Result<(), BrokerError> {
        self.exec(
            "destroyQueue(java.lang.String,boolean,boolean)",
            vec![json!(name), json!(remove_consumers), json!(false)],
        )
        .await
        .map(|_| ())
    }

    /// `createAddress(name, routingTypes)`.
    pub async fn create_address(&self, name: &str, routing_types: &str) -> Result<(), BrokerError> {
        self.exec(
            "createAddress(java.lang.String,java.lang.String)",
            vec![json!(name), json!(routing_types)],
        )
        .await
        .map(|_| ())
    }

    /// `deleteAddress(name)`: the force-free variant only (ADR-0049).
    pub async fn delete_address(&self, name: &str) -> Result<(), BrokerError> {
        self.exec("deleteAddress(java.lang.String)", vec![json!(name)])
            .await
            .map(|_| ())
    }

    /// `createDivert(String json)` (2.38+). The broker ignores a duplicate or a missing address
    /// silently: verify with `divert_names` afterwards.
    pub async fn create_divert(&self, configuration: &Value) -> Result<(), BrokerError> {
        self.exec(
            "createDivert(java.lang.String)",
            vec![json!(configuration.to_string())],
        )
        .await
        .map(|_| ())
    }

    /// `updateDivert(String json)`: whole configuration (an omitted routing type resets to STRIP).
    pub async fn update_divert(&self, configuration: &Value) -> Result<(), BrokerError> {
        self.exec(
            "updateDivert(java.lang.String)",
            vec![json!(configuration.to_string())],
        )
        .await
        .map(|_| ())
    }

    pub async fn destroy_divert(&self, name: &str) -> Result<(), BrokerError> {
        self.exec("destroyDivert(java.lang.String)", vec![json!(name)])
            .await
            .map(|_| ())
    }

    pub async fn divert_names(&self) -> Result<Vec<String>, BrokerError> {
        let v = self
            .client
            .call(JolokiaRequest::read(self.broker(), "DivertNames"))
            .await?;
        Ok(v.as_array()
            .map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect())
            .unwrap_or_default())
    }

    /// Whether a divert of this name is bound on `address` on this node: one read of its own
    /// MBean, not the node's whole `DivertNames` (which grows with every tap).
    pub async fn divert_exists(&self, address: &str, name: &str) -> Result<bool, BrokerError> {
        let mbean = super::mbean::divert(&self.broker_name, address, name);
        match self
            .client
            .call(JolokiaRequest::read(mbean, "ForwardingAddress"))
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if e.is_no_such_mbean() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// `listBindingsForAddress(address)`: binding names (queues and diverts).
    pub async fn bindings_for_address(&self, address: &str) -> Result<Value, BrokerError> {
        self.exec("listBindingsForAddress(java.lang.String)", vec![json!(address)])
            .await
    }

    /// `addAddressSettings(match, json)` (2.32+): replaces the whole entry.
    pub async fn add_address_settings(&self, matcher: &str, settings: &Value) -> Result<(), BrokerError> {
        self.exec(
            "addAddressSettings(java.lang.String,java.lang.String)",
            vec![json!(matcher), json!(settings.to_string())],
        )
        .await
        .map(|_| ())
    }

    pub async fn remove_address_settings(&self, matcher: &str) -> Result<(), BrokerError> {
        self.exec("removeAddressSettings(java.lang.String)", vec![json!(matcher)])
            .await
            .map(|_| ())
    }

    /// `addSecuritySettings(match, send, consume, createDurableQueue, deleteDurableQueue,
    /// createNonDurableQueue, deleteNonDurableQueue, manage, browse, createAddress,
    /// deleteAddress, view, edit)`: comma-separated role lists; replaces the entry; persisted.
    pub async fn add_security_settings(
        &self,
        matcher: &str,
        roles: &SecurityRoles,
    ) -> Result<(), BrokerError> {
        let r = roles;
        self.exec(
            "addSecuritySettings(java.lang.String,java.lang.String,java.lang.String,java.lang.String,java.lang.String,java.lang.String,java.lang.String,java.lang.String,java.lang.String,java.lang.String,java.lang.String,java.lang.String,java.lang.String)",
            vec![
                json!(matcher),
                json!(r.send),
                json!(r.consume),
                json!(r.create_durable_queue),
                json!(r.delete_durable_queue),
                json!(r.create_non_durable_queue),
                json!(r.delete_non_durable_queue),
                json!(r.manage),
                json!(r.browse),
                json!(r.create_address),
                json!(r.delete_address),
                json!(r.view),
                json!(r.edit),
            ],
        )
        .await
        .map(|_| ())
    }

    pub async fn remove_security_settings(&self, matcher: &str) -> Result<(), BrokerError> {
        self.exec("removeSecuritySettings(java.lang.String)", vec![json!(matcher)])
            .await
            .map(|_| ())
    }

    /// What a capture tap's preflight needs to know of this node (ADR-0062 D8), in one bulk
    /// request: whether the broker enforces security at all, and whether this management user
    /// may add a security setting (hawtio's `ArtemisJMXSecurity.canInvoke`, which applies the
    /// broker's management.xml to the caller). `may_add_security` is None when the broker
    /// serves no such MBean (the write itself is then the test).
    pub async fn security_authority(&self) -> Result<SecurityAuthority, BrokerError> {
        let mut r = self
            .client
            .bulk(&[
                JolokiaRequest::read(self.broker(), "SecurityEnabled"),
                JolokiaRequest::exec(
                    mbean::JMX_SECURITY.to_string(),
                    "canInvoke(java.lang.String,java.lang.String)",
                    vec![json!(self.broker()), json!("addSecuritySettings")],
                ),
            ])
            .await?
            .into_iter();
        let enabled = bool_value(
            &r.next()
                .unwrap_or_else(|| Err(BrokerError::BadResponse("short bulk response".into())))?,
        )?;
        let may = match r.next() {
            Some(Ok(v)) => v.as_bool(),
            _ => None,
        };
        Ok(SecurityAuthority {
            security_enabled: enabled,
            may_add_security: may,
        })
    }

    /// The effective address settings and security roles of each address (the broker's merge of
    /// every matching entry), two reads per address in one bulk request.
    pub async fn effective_settings(
        &self,
        addresses: &[String],
    ) -> Result<Vec<EffectiveSettings>, BrokerError> {
        let requests: Vec<JolokiaRequest> = addresses
            .iter()
            .flat_map(|a| {
                [
                    JolokiaRequest::exec(
                        self.broker(),
                        "getAddressSettingsAsJSON(java.lang.String)",
                        vec![json!(a)],
                    ),
                    JolokiaRequest::exec(self.broker(), "getRolesAsJSON(java.lang.String)", vec![json!(a)]),
                ]
            })
            .collect();
        let results = self.client.bulk(&requests).await?;
        let parse = |r: Result<Value, BrokerError>| -> Result<Value, BrokerError> {
            let v = r?;
            v.as_str()
                .and_then(|s| serde_json::from_str(s).ok())
                .ok_or_else(|| BrokerError::BadResponse(format!("settings read did not return JSON: {v}")))
        };
        let mut it = results.into_iter();
        let mut out = vec![];
        for _ in addresses {
            let (Some(a), Some(r)) = (it.next(), it.next()) else {
                return Err(BrokerError::BadResponse("short bulk response".into()));
            };
            out.push(EffectiveSettings {
                address_settings: parse(a)?,
                roles: parse(r)?,
            });
        }
        Ok(out)
    }

    /// The broker's uptime in milliseconds and, per address, its RoutedMessageCount (counted
    /// since this broker became active), in one bulk request; None for an address not there.
    pub async fn source_routed(
        &self,
        addresses: &[String],
    ) -> Result<(Option<i64>, Vec<Option<i64>>), BrokerError> {
        let mut requests = vec![JolokiaRequest::read(
            mbean::broker(&self.broker_name),
            "UptimeMillis",
        )];
        requests.extend(
            addresses
                .iter()
                .map(|a| JolokiaRequest::read(mbean::address(&self.broker_name, a), "RoutedMessageCount")),
        );
        let results = self.client.bulk(&requests).await?;
        if results.len() != requests.len() {
            return Err(BrokerError::BadResponse("short bulk response".into()));
        }
        let mut it = results.into_iter().map(|r| r.ok().and_then(|v| v.as_i64()));
        let uptime = it.next().flatten();
        Ok((uptime, it.collect()))
    }

    /// Sampling (ADR-0062 D3): browse each queue's first `depth` messages with
    /// `QueueControl.browse(int page, int pageSize)` — a browse never consumes, acknowledges or
    /// moves a message (QueueControlImpl iterates `queue.browserIterator()` under the
    /// management lock) — and read each distinct address's effective
    /// `managementMessageAttributeSizeLimit` (the length at which the broker cuts a body or
    /// property preview), all in ONE bulk request. One result per target, in order.
    pub async fn browse_queues(
        &self,
        targets: &[BrowseTarget],
        depth: i32,
    ) -> Result<Vec<Browse>, BrokerError> {
        let mut addresses: Vec<&str> = targets.iter().map(|t| t.address.as_str()).collect();
        addresses.sort_unstable();
        addresses.dedup();
        let mut requests: Vec<JolokiaRequest> = targets
            .iter()
            .map(|t| {
                JolokiaRequest::exec(
                    mbean::queue(&self.broker_name, &t.address, &t.routing_type, &t.queue),
                    "browse(int,int)",
                    vec![json!(1), json!(depth)],
                )
            })
            .collect();
        requests.extend(addresses.iter().map(|a| {
            JolokiaRequest::exec(
                self.broker(),
                "getAddressSettingsAsJSON(java.lang.String)",
                vec![json!(a)],
            )
        }));
        let results = self.client.bulk(&requests).await?;
        if results.len() != requests.len() {
            return Err(BrokerError::BadResponse("short bulk response".into()));
        }
        let mut it = results.into_iter();
        let browsed: Vec<Result<Value, BrokerError>> = it.by_ref().take(targets.len()).collect();
        let limits: std::collections::BTreeMap<&str, Option<i64>> = addresses
            .iter()
            .zip(it)
            .map(|(a, r)| (*a, r.ok().as_ref().and_then(preview_limit)))
            .collect();
        Ok(targets
            .iter()
            .zip(browsed)
            .map(|(t, r)| Browse {
                messages: r.and_then(|v| match v {
                    Value::Array(a) => Ok(a),
                    Value::Null => Ok(vec![]),
                    other => Err(BrokerError::BadResponse(format!(
                        "browse did not return an array: {}",
                        other.to_string().chars().take(80).collect::<String>()
                    ))),
                }),
                preview_limit: limits.get(t.address.as_str()).copied().flatten(),
            })
            .collect())
    }

    /// The `host:port` of an acceptor that speaks AMQP, with TLS (`sslEnabled`) when `tls` is
    /// asked for and without it otherwise (a dedicated AMQP acceptor first), from the broker's
    /// acceptor MBeans; None when there is none.
    pub async fn amqp_acceptor(&self, tls: bool) -> Result<Option<(String, u16)>, BrokerError> {
        let pattern = format!("{},component=acceptors,name=*", mbean::broker(&self.broker_name));
        let v = self
            .client
            .call(JolokiaRequest::read(pattern, "Parameters"))
            .await?;
        let mut best: Option<(bool, String, u16)> = None;
        for params in v.as_object().into_iter().flat_map(|m| m.values()) {
            let p = params.get("Parameters").unwrap_or(params);
            let get = |k: &str| p.get(k).and_then(Value::as_str).unwrap_or("");
            let protocols = get("protocols").to_ascii_uppercase();
            let ssl = get("sslEnabled").eq_ignore_ascii_case("true");
            let speaks_amqp = protocols.is_empty() || protocols.split(',').any(|x| x.trim() == "AMQP");
            let Ok(port) = get("port").parse::<u16>() else {
                continue;
            };
            if ssl != tls || !speaks_amqp {
                continue;
            }
            let dedicated = protocols == "AMQP";
            if best.as_ref().is_none_or(|(d, _, _)| dedicated && !d) {
                best = Some((dedicated, get("host").to_string(), port));
            }
        }
        Ok(best.map(|(_, h, p)| (h, p)))
    }

    /// Several filtered listings in one bulk request (ADR-0057: each a broker-side filtered
    /// lookup, never a full listing).
    pub async fn list_many(
        &self,
        queries: &[(ListKind, &str, &str)],
    ) -> Result<Vec<Vec<Value>>, BrokerError> {
        let requests: Vec<JolokiaRequest> = queries
            .iter()
            .map(|(what, field, value)| {
                let options = json!({"field": field, "operation": "EQUALS", "value": value}).to_string();
                JolokiaRequest::exec(
                    self.broker(),
                    what.operation(),
                    vec![json!(options), json!(1), json!(1000)],
                )
            })
            .collect();
        let results = self.client.bulk(&requests).await?;
        results
            .into_iter()
            .zip(queries)
            .map(|(r, (what, _, _))| {
                let v = r?;
                let parsed: Value =
                    v.as_str()
                        .and_then(|s| serde_json::from_str(s).ok())
                        .ok_or_else(|| {
                            BrokerError::BadResponse(format!("{} did not return JSON", what.operation()))
                        })?;
                Ok(parsed
                    .get("data")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default())
            })
            .collect()
    }

    /// Every row of one filtered listing, page after page, until the broker's reported `count`
    /// is reached (a first page alone undercounts, ADR-0057 D6).
    pub async fn list_all(
        &self,
        what: ListKind,
        field: &str,
        value: &str,
    ) -> Result<Vec<Value>, BrokerError> {
        const PAGE: u64 = 1000;
        let options = json!({"field": field, "operation": "EQUALS", "value": value}).to_string();
        let mut rows: Vec<Value> = vec![];
        for page in 1..=1000u64 {
            let v = self
                .client
                .call(JolokiaRequest::exec(
                    self.broker(),
                    what.operation(),
                    vec![json!(options), json!(page), json!(PAGE)],
                ))
                .await?;
            let parsed: Value = v
                .as_str()
                .and_then(|s| serde_json::from_str(s).ok())
                .ok_or_else(|| {
                    BrokerError::BadResponse(format!("{} did not return JSON", what.operation()))
                })?;
            let data = parsed
                .get("data")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let total = parsed.get("count").and_then(Value::as_u64);
            let got = data.len() as u64;
            rows.extend(data);
            if got < PAGE || total.is_some_and(|t| rows.len() as u64 >= t) {
                break;
            }
        }
        Ok(rows)
    }

    /// `listConnections/listSessions/listConsumers(options, page, pageSize)` with one filter.
    pub async fn list(&self, what: ListKind, field: &str, value: &str) -> Result<Vec<Value>, BrokerError> {
        Ok(self
            .list_many(&[(what, field, value)])
            .await?
            .pop()
            .unwrap_or_default())
    }

    pub async fn close_connection(&self, connection_id: &str) -> Result<bool, BrokerError> {
        bool_value(
            &self
                .exec(
                    "closeConnectionWithID(java.lang.String)",
                    vec![json!(connection_id)],
                )
                .await?,
        )
    }

    pub async fn close_session(&self, connection_id: &str, session_id: &str) -> Result<bool, BrokerError> {
        bool_value(
            &self
                .exec(
                    "closeSessionWithID(java.lang.String,java.lang.String)",
                    vec![json!(connection_id), json!(session_id)],
                )
                .await?,
        )
    }

    pub async fn close_consumer(&self, session_id: &str, consumer_id: i64) -> Result<bool, BrokerError> {
        bool_value(
            &self
                .exec(
                    "closeConsumerWithID(java.lang.String,java.lang.String)",
                    vec![json!(session_id), json!(consumer_id.to_string())],
                )
                .await?,
        )
    }

    pub async fn close_consumer_connections_for_address(&self, address: &str) -> Result<bool, BrokerError> {
        bool_value(
            &self
                .exec(
                    "closeConsumerConnectionsForAddress(java.lang.String)",
                    vec![json!(address)],
                )
                .await?,
        )
    }
}

/// A queue to browse (sampling).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct BrowseTarget {
    pub queue: String,
    pub address: String,
    /// ANYCAST or MULTICAST, as the inventory reports it.
    pub routing_type: String,
}

/// One queue's browse: the messages as the broker's CompositeData (as Jolokia renders it), and
/// the preview limit that applied to their bodies (None: unknown).
#[derive(Clone, Debug)]
pub struct Browse {
    pub messages: Result<Vec<Value>, BrokerError>,
    pub preview_limit: Option<i64>,
}

/// `managementMessageAttributeSizeLimit` from `getAddressSettingsAsJSON`'s string; the broker's
/// default (256) when the document does not name it.
fn preview_limit(v: &Value) -> Option<i64> {
    let doc: Value = serde_json::from_str(v.as_str()?).ok()?;
    Some(
        doc.get("managementMessageAttributeSizeLimit")
            .and_then(Value::as_i64)
            .unwrap_or(256),
    )
}

/// Whether a node lets the operator restrict a capture queue (ADR-0062 D8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SecurityAuthority {
    /// The broker enforces security settings at all (`security-enabled`).
    pub security_enabled: bool,
    /// The management user may call `addSecuritySettings` (None: the broker cannot say).
    pub may_add_security: Option<bool>,
}

/// What the broker applies to one address: `getAddressSettingsAsJSON` and `getRolesAsJSON`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EffectiveSettings {
    pub address_settings: Value,
    pub roles: Value,
}

/// Role lists (comma-separated) per permission of one security-setting match.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SecurityRoles {
    pub send: String,
    pub consume: String,
    pub create_durable_queue: String,
    pub delete_durable_queue: String,
    pub create_non_durable_queue: String,
    pub delete_non_durable_queue: String,
    pub manage: String,
    pub browse: String,
    pub create_address: String,
    pub delete_address: String,
    pub view: String,
    pub edit: String,
}

#[derive(Clone, Copy, Debug)]
pub enum ListKind {
    Connections,
    Sessions,
    Consumers,
}

impl ListKind {
    fn operation(self) -> &'static str {
        match self {
            ListKind::Connections => "listConnections(java.lang.String,int,int)",
            ListKind::Sessions => "listSessions(java.lang.String,int,int)",
            ListKind::Consumers => "listConsumers(java.lang.String,int,int)",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_topology_with_a_backup() {
        let v = json!(
            "[{\"nodeID\":\"n1\",\"live\":\"127.0.0.1:61726\",\"primary\":\"127.0.0.1:61726\",\"backup\":\"127.0.0.1:61727\"},{\"nodeID\":\"n2\",\"live\":\"127.0.0.1:61728\"}]"
        );
        let t = parse_topology(&v).expect("parse");
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].backup.as_deref(), Some("127.0.0.1:61727"));
        assert_eq!(t[1].primary, None);
    }
}
