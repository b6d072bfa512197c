//! Looking for one message on a queue (issue 48: `kubectl artemis capture verify`).

use serde_json::{Value, json};

use super::management::BrokerManagement;
use super::{BrokerError, JolokiaRequest, mbean};

impl BrokerManagement {
    /// Issue 48 (verify): where a message with this user id (`AMQUserID`: a Core message's
    /// JMSMessageID, an AMQP message's message-id) is on one queue, in one bulk request: waiting
    /// (`browse(1, 1, filter)`, which stops at the first match), being delivered
    /// (`countDeliveringMessages(filter)`, over the in-flight messages only) or scheduled
    /// (`listScheduledMessagesAsJSON()`, matched here). Artemis 2.40 has no index on the id: a
    /// miss scans the queue on the broker (never sent to the caller).
    pub async fn find_message(
        &self,
        queue: (&str, &str, &str),
        user_id: &str,
    ) -> Result<MessagePresence, BrokerError> {
        let (address, routing_type, name) = queue;
        let id = if user_id.starts_with("ID:") {
            user_id.to_string()
        } else {
            format!("ID:{user_id}")
        };
        let filter = format!("AMQUserID = '{}'", id.replace('\'', "''"));
        let mbean = mbean::queue(self.broker_name(), address, routing_type, name);
        let requests = vec![
            JolokiaRequest::exec(
                mbean.clone(),
                "browse(int,int,java.lang.String)",
                vec![json!(1), json!(1), json!(filter)],
            ),
            JolokiaRequest::exec(
                mbean.clone(),
                "countDeliveringMessages(java.lang.String)",
                vec![json!(filter)],
            ),
            JolokiaRequest::exec(mbean, "listScheduledMessagesAsJSON()", vec![]),
        ];
        let mut answers = self.client().call_together(requests).await.into_iter();
        let mut next = || {
            answers
                .next()
                .unwrap_or(Err(BrokerError::BadResponse("no answer".into())))
        };
        let (waiting, delivering, scheduled) = (next()?, next()?, next()?);
        if waiting.as_array().is_some_and(|a| !a.is_empty()) {
            return Ok(MessagePresence::Waiting);
        }
        if delivering.as_i64().is_some_and(|n| n > 0) {
            return Ok(MessagePresence::Delivering);
        }
        let listed: Vec<Value> = scheduled
            .as_str()
            .and_then(|s| serde_json::from_str(s).ok())
            .unwrap_or_default();
        // Listings prefix "ID:" to the user id whatever it held (Message.toMap).
        let matches = |m: &Value| {
            m.get("userID")
                .and_then(Value::as_str)
                .is_some_and(|u| u == id || u.strip_prefix("ID:") == Some(id.as_str()))
        };
        Ok(if listed.iter().any(matches) {
            MessagePresence::Scheduled
        } else {
            MessagePresence::Absent
        })
    }
}

/// Where a message is on one queue (issue 48: verify).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum MessagePresence {
    /// On the queue, waiting for a consumer.
    Waiting,
    /// Delivered to a consumer, not yet acknowledged.
    Delivering,
    /// Scheduled for later delivery.
    Scheduled,
    /// Not on this queue.
    Absent,
}

/// A replayed message's body, as `AddressControl.sendMessage` takes it (issue 48).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SentBody {
    /// Written as a Core text body (type 3).
    Text(String),
    /// Written as the bytes themselves (type 4; base64 on the wire, decoded by the broker).
    Bytes(Vec<u8>),
    /// No body (type 0).
    Empty,
}

impl SentBody {
    pub fn kind(&self) -> &'static str {
        match self {
            SentBody::Text(_) => "text",
            SentBody::Bytes(_) => "bytes",
            SentBody::Empty => "empty",
        }
    }

    pub fn len(&self) -> usize {
        match self {
            SentBody::Text(t) => t.len(),
            SentBody::Bytes(b) => b.len(),
            SentBody::Empty => 0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `(type, body)` of `sendMessage`.
    fn wire(&self) -> (i32, Value) {
        use base64::Engine;
        match self {
            SentBody::Text(t) => (3, json!(t)),
            SentBody::Bytes(b) => (4, json!(base64::engine::general_purpose::STANDARD.encode(b))),
            SentBody::Empty => (0, Value::Null),
        }
    }
}

impl BrokerManagement {
    /// Issue 48 (replay): one durable message to `address` on this node, through
    /// `AddressControl.sendMessage(headers, type, body, durable, user, password, createMessageId)`
    /// (Artemis 2.40): the properties become string properties, the broker checks SEND for the
    /// user on a session of its own, gives the message a new user id (`createMessageId`), and
    /// answers with the new message's broker ID. An address the node does not have has no
    /// MBean: the call is refused, nothing is created.
    pub async fn send_message(
        &self,
        address: &str,
        properties: &std::collections::BTreeMap<String, String>,
        body: &SentBody,
    ) -> Result<String, BrokerError> {
        let (kind, body) = body.wire();
        let c = self.client().credentials();
        let request = JolokiaRequest::exec(
            mbean::address(self.broker_name(), address),
            "sendMessage(java.util.Map,int,java.lang.String,boolean,java.lang.String,java.lang.String,boolean)",
            vec![
                json!(properties),
                json!(kind),
                body,
                json!(true),
                json!(c.username),
                json!(c.password),
                json!(true),
            ],
        );
        let id = self.client().call(request).await?;
        Ok(id.as_str().map(str::to_string).unwrap_or_else(|| id.to_string()))
    }
}
