//! MBean ObjectNames, built by one quoting function (JMX `ObjectName.quote` rules;
//! Artemis's `ObjectNameBuilder` quotes every value).

/// Quote a value for an ObjectName: wrap in `"` and escape `"`, `*`, `?`, `\` and newline.
pub fn quote(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '*' => out.push_str("\\*"),
            '?' => out.push_str("\\?"),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

const DOMAIN: &str = "org.apache.activemq.artemis";

/// Hawtio's view of the broker's management.xml for the calling user (`canInvoke`).
pub const JMX_SECURITY: &str = "hawtio:type=security,area=jmx,name=ArtemisJMXSecurity";

/// The broker's control MBean.
pub fn broker(broker_name: &str) -> String {
    format!("{DOMAIN}:broker={}", quote(broker_name))
}

/// Pattern matching every broker control MBean (for discovering the broker name).
pub fn broker_search_pattern() -> String {
    format!("{DOMAIN}:broker=*")
}

pub fn address(broker_name: &str, address: &str) -> String {
    format!(
        "{},component=addresses,address={}",
        broker(broker_name),
        quote(address)
    )
}

/// `routing_type` as the broker reports it (ANYCAST/MULTICAST); the ObjectName uses lower case.
pub fn queue(broker_name: &str, address_name: &str, routing_type: &str, queue: &str) -> String {
    format!(
        "{},subcomponent=queues,routing-type={},queue={}",
        address(broker_name, address_name),
        quote(&routing_type.to_ascii_lowercase()),
        quote(queue)
    )
}

pub fn divert(broker_name: &str, address_name: &str, divert: &str) -> String {
    format!(
        "{},subcomponent=diverts,divert={}",
        address(broker_name, address_name),
        quote(divert)
    )
}

/// Pattern for one queue by name, on whatever address and routing type it has (a queue name is
/// unique per broker). Names with wildcard characters are refused before they get here.
pub fn queue_anywhere(broker_name: &str, queue: &str) -> String {
    format!(
        "{},component=addresses,address=*,subcomponent=queues,routing-type=*,queue={}",
        broker(broker_name),
        quote(queue)
    )
}

/// Pattern for one divert by name, on whatever source address it has (unique per broker).
pub fn divert_anywhere(broker_name: &str, divert: &str) -> String {
    format!(
        "{},component=addresses,address=*,subcomponent=diverts,divert={}",
        broker(broker_name),
        quote(divert)
    )
}

/// Wildcard patterns for the inventory scrape: every queue, every address, every divert.
pub fn all_queues(broker_name: &str) -> String {
    format!(
        "{},component=addresses,address=*,subcomponent=queues,routing-type=*,queue=*",
        broker(broker_name)
    )
}
/// A quoted ObjectName value pattern: every value that starts with `prefix` (JMX property value
/// patterns; the prefix's own `*` and `?` are escaped, so they match only themselves).
fn starting_with(prefix: &str) -> String {
    let quoted = quote(prefix);
    format!("{}*\"", &quoted[..quoted.len() - 1])
}

/// Pattern matching the address MBeans whose name starts with `prefix`.
pub fn addresses_starting_with(broker_name: &str, prefix: &str) -> String {
    format!(
        "{},component=addresses,address={}",
        broker(broker_name),
        starting_with(prefix)
    )
}

/// Pattern matching the anycast queues named like their address, both starting with `prefix`
/// (a capture ring is such a queue).
pub fn own_address_queues_starting_with(broker_name: &str, prefix: &str) -> String {
    format!(
        "{},subcomponent=queues,routing-type=\"anycast\",queue={}",
        addresses_starting_with(broker_name, prefix),
        starting_with(prefix)
    )
}

pub fn all_addresses(broker_name: &str) -> String {
    format!("{},component=addresses,address=*", broker(broker_name))
}
pub fn all_diverts(broker_name: &str) -> String {
    format!(
        "{},component=addresses,address=*,subcomponent=diverts,divert=*",
        broker(broker_name)
    )
}

/// The broker name inside a broker control ObjectName (and nothing else), if it is one.
pub fn broker_name_of(object_name: &str) -> Option<String> {
    let rest = object_name.strip_prefix(DOMAIN)?.strip_prefix(":broker=\"")?;
    let mut name = String::new();
    let mut chars = rest.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next()? {
                'n' => name.push('\n'),
                escaped => name.push(escaped),
            },
            // The closing quote must end the ObjectName: a longer one is a child MBean.
            '"' => return chars.next().is_none().then_some(name),
            c => name.push(c),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_special_characters() {
        assert_eq!(quote("plain"), "\"plain\"");
        assert_eq!(quote("a\"b*c?d\\e"), "\"a\\\"b\\*c\\?d\\\\e\"");
        assert_eq!(quote("x\ny"), "\"x\\ny\"");
    }

    #[test]
    fn builds_queue_names_with_lower_case_routing_type() {
        assert_eq!(
            queue("c1", "orders", "ANYCAST", "orders.in"),
            "org.apache.activemq.artemis:broker=\"c1\",component=addresses,address=\"orders\",subcomponent=queues,routing-type=\"anycast\",queue=\"orders.in\""
        );
    }

    #[test]
    fn a_prefix_pattern_wildcards_only_its_end() {
        assert_eq!(
            own_address_queues_starting_with("c1", "cap.x*."),
            "org.apache.activemq.artemis:broker=\"c1\",component=addresses,address=\"cap.x\\*.*\",subcomponent=queues,routing-type=\"anycast\",queue=\"cap.x\\*.*\""
        );
    }

    #[test]
    fn reads_the_broker_name_back() {
        assert_eq!(broker_name_of(&broker("my \"b\"")).as_deref(), Some("my \"b\""));
        assert_eq!(broker_name_of(&address("b", "a")), None);
        assert_eq!(broker_name_of("other:broker=\"x\""), None);
    }
}
