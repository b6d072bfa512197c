//! Finding the copy at fault (issue 25): a batch Postgres refuses for a data reason is split in
//! halves until each copy it refuses is alone; such a copy gets one salvage (see
//! `store::storable::salvage`) and, refused again, is counted as unstorable and skipped — never
//! retried for ever. A refusal because Postgres is unavailable splits nothing: the work is held
//! and resumes where it stopped, so what was already stored is not sent again.

use std::future::Future;

/// Why Postgres did not take a part of a batch.
#[derive(Debug)]
pub enum Refusal<E> {
    /// Refused for what was sent: splitting finds the copy at fault. The SQLSTATE is the
    /// refusal's class (`store::storable` salvages by it), never a message.
    Data { sqlstate: String },
    /// Postgres was not available: the same request may succeed later.
    Unavailable(E),
}

/// Where a batch goes.
pub trait Sink<T> {
    type Error;
    /// Store these rows in one statement; the rows stored.
    fn insert(&mut self, rows: &[T]) -> impl Future<Output = Result<u64, Refusal<Self::Error>>> + Send;
    /// The last resort for a row refused alone, once; None: it cannot be stored.
    fn salvage(&self, row: &T, sqlstate: &str) -> Option<T>;
}

/// One batch on its way into the store.
#[derive(Debug)]
pub struct SplitInsert<T> {
    /// Parts still to store; the next is last.
    pending: Vec<Vec<T>>,
    /// Rows stored so far.
    pub stored: u64,
    /// Rows that cannot be stored, skipped.
    pub unstorable: u64,
    /// The SQLSTATE of each unstorable row's last refusal.
    pub causes: Vec<String>,
}

impl<T> SplitInsert<T> {
    pub fn new(rows: Vec<T>) -> Self {
        SplitInsert {
            pending: if rows.is_empty() { vec![] } else { vec![rows] },
            stored: 0,
            unstorable: 0,
            causes: vec![],
        }
    }

    /// Store what is pending. Err: Postgres is unavailable; what is not stored yet stays
    /// pending for the next call.
    pub async fn run<S: Sink<T>>(&mut self, sink: &mut S) -> Result<(), S::Error> {
        while let Some(mut part) = self.pending.pop() {
            match sink.insert(&part).await {
                Ok(n) => self.stored += n,
                Err(Refusal::Unavailable(e)) => {
                    self.pending.push(part);
                    return Err(e);
                }
                Err(Refusal::Data { .. }) if part.len() > 1 => {
                    let second = part.split_off(part.len() / 2);
                    self.pending.push(second);
                    self.pending.push(part);
                }
                Err(Refusal::Data { sqlstate }) => {
                    match part.first().and_then(|r| sink.salvage(r, &sqlstate)) {
                        Some(salvaged) => self.pending.push(vec![salvaged]),
                        None => {
                            self.unstorable += 1;
                            self.causes.push(sqlstate);
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store that refuses any part holding a poison row (as Postgres refuses a whole
    /// statement), or everything while it is down; salvage turns `p` into `s` once, and
    /// `x` cannot be salvaged.
    #[derive(Default)]
    struct Fake {
        stored: Vec<&'static str>,
        statements: usize,
        down: bool,
    }

    impl Sink<&'static str> for Fake {
        type Error = &'static str;
        async fn insert(&mut self, rows: &[&'static str]) -> Result<u64, Refusal<&'static str>> {
            self.statements += 1;
            if self.down {
                return Err(Refusal::Unavailable("down"));
            }
            if rows.iter().any(|r| *r == "p" || *r == "x") {
                return Err(Refusal::Data {
                    sqlstate: "22P05".into(),
                });
            }
            self.stored.extend_from_slice(rows);
            Ok(rows.len() as u64)
        }
        fn salvage(&self, row: &&'static str, _: &str) -> Option<&'static str> {
            (*row == "p").then_some("s")
        }
    }

    #[test]
    fn a_poison_row_is_found_by_halving_and_everything_else_is_stored_in_order() {
        let rows: Vec<&'static str> = vec!["a", "b", "c", "x", "d", "e", "f", "g"];
        let mut work = SplitInsert::new(rows);
        let mut sink = Fake::default();
        futures::executor::block_on(work.run(&mut sink)).expect("stored");
        assert_eq!(sink.stored, vec!["a", "b", "c", "d", "e", "f", "g"]);
        assert_eq!((work.stored, work.unstorable), (7, 1));
        assert_eq!(work.causes, vec!["22P05".to_string()]);
        // 1 + 2 halves + 2 quarters + 2 eighths: a handful of statements, not one per row.
        assert!(sink.statements <= 7, "{} statements", sink.statements);
    }

    #[test]
    fn a_row_refused_alone_is_salvaged_once() {
        let mut work = SplitInsert::new(vec!["a", "p", "b"]);
        let mut sink = Fake::default();
        futures::executor::block_on(work.run(&mut sink)).expect("stored");
        assert_eq!(sink.stored, vec!["a", "s", "b"]);
        assert_eq!((work.stored, work.unstorable), (3, 0));
    }

    #[test]
    fn an_unavailable_store_splits_nothing_and_resumes_where_it_stopped() {
        let mut work = SplitInsert::new(vec!["a", "x", "b", "c"]);
        let mut sink = Fake {
            down: true,
            ..Default::default()
        };
        assert_eq!(futures::executor::block_on(work.run(&mut sink)), Err("down"));
        assert_eq!(sink.statements, 1);
        sink.down = false;
        futures::executor::block_on(work.run(&mut sink)).expect("stored");
        assert_eq!(sink.stored, vec!["a", "b", "c"]);
        assert_eq!(work.unstorable, 1);
    }

    #[test]
    fn an_empty_batch_needs_no_statement() {
        let mut work = SplitInsert::<&'static str>::new(vec![]);
        let mut sink = Fake::default();
        futures::executor::block_on(work.run(&mut sink)).expect("nothing to do");
        assert_eq!(sink.statements, 0);
    }
}
