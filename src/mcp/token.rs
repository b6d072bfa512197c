//! Confirmation tokens (issue 48): a preview returns one, bound to the object it showed (its
//! namespace, name and uid) and the generation (and resourceVersion) it saw; the apply it
//! names is refused when the token is unknown, for another step, too old, or when the object
//! was replaced or its spec changed since.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long a preview's token may be applied.
pub const VALID_FOR: Duration = Duration::from_secs(15 * 60);

/// What a token confirms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// `apply_queue`: the dry-run ArtemisQueue made live (`spec.dryRun: false`).
    Queue,
    /// `apply_queue_delete`: the ArtemisQueue deleted, destroying at most what was shown.
    QueueDelete,
    /// `apply_replay`: the MessageReplay confirmed (`spec.confirm` set to the address shown),
    /// which sends a new message, once.
    Replay,
}

impl Step {
    fn tools(self) -> (&'static str, &'static str) {
        match self {
            Step::Queue => ("preview_queue", "apply_queue"),
            Step::QueueDelete => ("preview_queue_delete", "apply_queue_delete"),
            Step::Replay => ("preview_replay", "apply_replay"),
        }
    }
}

/// One preview as it was shown.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Preview {
    pub step: Step,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub generation: i64,
    pub resource_version: String,
    /// A delete's messages as the preview showed them (its blast radius).
    pub messages: u64,
    /// A replay's address as the preview showed it: what `spec.confirm` is set to.
    pub address: String,
}

impl Preview {
    pub fn object(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The object as it is now is still the one previewed: the same object (uid) with the same
    /// spec (generation).
    pub fn still_shown(&self, uid: Option<&str>, generation: Option<i64>) -> Result<(), TokenError> {
        if uid != Some(self.uid.as_str()) {
            return Err(TokenError::Replaced {
                object: self.object(),
            });
        }
        if generation != Some(self.generation) {
            return Err(TokenError::Changed {
                object: self.object(),
                previewed: self.generation,
                now: generation.unwrap_or_default(),
                preview: self.step.tools().0,
            });
        }
        Ok(())
    }
}

/// Why a token does not confirm an apply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error(
        "refused: this confirmation token was not issued by this server (a token comes from a preview tool's answer, and lives only as long as the server that issued it): call {preview} first"
    )]
    Unknown { preview: &'static str },
    #[error("refused: this token confirms {issued_for}'s preview, not {used_for}: call {preview} first")]
    OtherStep {
        issued_for: &'static str,
        used_for: &'static str,
        preview: &'static str,
    },
    #[error("refused: this token is over {minutes} minutes old: call {preview} again", minutes = VALID_FOR.as_secs() / 60)]
    Expired { preview: &'static str },
    #[error(
        "refused: {object} was deleted (and perhaps re-created) since the preview: nothing was applied; preview it again"
    )]
    Replaced { object: String },
    #[error(
        "refused: the token is stale: {object} changed since the preview (generation {previewed} then, {now} now), so what was shown is no longer what would be applied; nothing was applied: call {preview} again and review the new outcome"
    )]
    Changed {
        object: String,
        previewed: i64,
        now: i64,
        preview: &'static str,
    },
}

/// The previews this server issued, by token.
#[derive(Default)]
pub struct Previews {
    issued: HashMap<String, (Preview, Instant)>,
}

impl Previews {
    /// A new token for `preview` (older tokens past their validity are forgotten).
    pub fn issue(&mut self, preview: Preview, now: Instant) -> String {
        self.issued
            .retain(|_, (_, at)| now.duration_since(*at) < VALID_FOR);
        let token = format!("{}-{}", short(preview.step), uuid::Uuid::new_v4().simple());
        self.issued.insert(token.clone(), (preview, now));
        token
    }

    /// The preview a token confirms, for the apply `step`.
    pub fn redeem(&self, token: &str, step: Step, now: Instant) -> Result<Preview, TokenError> {
        let (preview, at) = self.issued.get(token.trim()).ok_or(TokenError::Unknown {
            preview: step.tools().0,
        })?;
        if preview.step != step {
            return Err(TokenError::OtherStep {
                issued_for: preview.step.tools().0,
                used_for: step.tools().1,
                preview: step.tools().0,
            });
        }
        if now.duration_since(*at) >= VALID_FOR {
            return Err(TokenError::Expired {
                preview: step.tools().0,
            });
        }
        Ok(preview.clone())
    }

    /// An applied token confirms nothing more.
    pub fn spend(&mut self, token: &str) {
        self.issued.remove(token.trim());
    }
}

fn short(step: Step) -> &'static str {
    match step {
        Step::Queue => "queue",
        Step::QueueDelete => "queue-delete",
        Step::Replay => "replay",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn preview(step: Step) -> Preview {
        Preview {
            step,
            namespace: "ns".into(),
            name: "orders".into(),
            uid: "u1".into(),
            generation: 2,
            resource_version: "100".into(),
            messages: 3,
            address: "orders".into(),
        }
    }

    #[test]
    fn a_token_confirms_only_its_own_step_while_it_is_valid_and_once() {
        let t0 = Instant::now();
        let mut p = Previews::default();
        let token = p.issue(preview(Step::Queue), t0);
        assert_eq!(p.redeem(&token, Step::Queue, t0), Ok(preview(Step::Queue)));
        assert!(matches!(
            p.redeem(&token, Step::QueueDelete, t0),
            Err(TokenError::OtherStep { .. })
        ));
        assert!(matches!(
            p.redeem(&token, Step::Replay, t0),
            Err(TokenError::OtherStep { .. })
        ));
        let replay = p.issue(preview(Step::Replay), t0);
        assert!(replay.starts_with("replay-"), "{replay}");
        assert_eq!(p.redeem(&replay, Step::Replay, t0), Ok(preview(Step::Replay)));
        let refused = p.redeem(&replay, Step::Queue, t0).map_err(|e| e.to_string());
        assert!(
            refused
                .as_ref()
                .is_err_and(|m| m.contains("preview_replay's preview, not apply_queue")),
            "{refused:?}"
        );
        assert!(matches!(
            p.redeem("queue-0000", Step::Queue, t0),
            Err(TokenError::Unknown { .. })
        ));
        assert!(matches!(
            p.redeem(&token, Step::Queue, t0 + VALID_FOR),
            Err(TokenError::Expired { .. })
        ));
        p.spend(&token);
        assert!(matches!(
            p.redeem(&token, Step::Queue, t0),
            Err(TokenError::Unknown { .. })
        ));
    }

    #[test]
    fn an_object_replaced_or_changed_since_the_preview_is_refused_with_the_reason() {
        let shown = preview(Step::QueueDelete);
        assert_eq!(shown.still_shown(Some("u1"), Some(2)), Ok(()));
        assert!(matches!(
            shown.still_shown(Some("u2"), Some(2)),
            Err(TokenError::Replaced { .. })
        ));
        let changed = shown.still_shown(Some("u1"), Some(3)).map_err(|e| e.to_string());
        assert!(
            changed
                .as_ref()
                .is_err_and(|m| m.contains("stale") && m.contains("generation 2 then, 3 now")),
            "{changed:?}"
        );
    }
}
