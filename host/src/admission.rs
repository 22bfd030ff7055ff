//! The admission ledger: how much of this Host's capacity is charged, and to whom. Owns the
//! rule that a charge belongs to one residency generation, so a late credit of an old
//! residency can never uncharge a successor; and the isolation rule for tenant-exclusive
//! Hosts. Pure bookkeeping; never performs I/O.

use std::collections::HashMap;

use sessionstore::TenantId;

use crate::error::HostError;
use crate::options::IsolationClass;
use crate::resident::SessionKey;

#[derive(Debug, Clone, Copy)]
struct Charge {
    generation: u64,
    weight: u32,
}

/// The ledger.
#[derive(Debug)]
pub(crate) struct Admission {
    capacity: u32,
    consumed: u32,
    isolation: IsolationClass,
    charges: HashMap<SessionKey, Charge>,
    accepting: bool,
}

impl Admission {
    pub fn new(capacity: u32, isolation: IsolationClass) -> Admission {
        Admission {
            capacity,
            consumed: 0,
            isolation,
            charges: HashMap::new(),
            accepting: false,
        }
    }

    pub fn set_accepting(&mut self, accepting: bool) {
        self.accepting = accepting;
    }

    pub fn consumed(&self) -> u32 {
        self.consumed
    }

    /// The sessions holding a charge now.
    pub fn charged(&self) -> impl Iterator<Item = &SessionKey> {
        self.charges.keys()
    }

    /// Charges `weight` for `key` under `generation`.
    pub fn admit(
        &mut self,
        key: &SessionKey,
        generation: u64,
        weight: u32,
    ) -> Result<(), HostError> {
        if !self.accepting {
            return Err(HostError::NotAdmitting(
                "this Host is not admitting sessions".into(),
            ));
        }
        if self.isolation == IsolationClass::TenantExclusive
            && let Some(other) = self.charges.keys().find(|k| k.tenant != key.tenant)
        {
            let _: &TenantId = &other.tenant;
            return Err(HostError::NotAdmitting(
                "this Host is tenant-exclusive and holds another tenant".into(),
            ));
        }
        if let Some(c) = self.charges.get_mut(key) {
            // A re-admission claims the existing charge for the attach in flight.
            c.generation = generation;
            return Ok(());
        }
        let free = self.capacity.saturating_sub(self.consumed);
        if weight > free {
            return Err(HostError::NoCapacity {
                needed: weight,
                free,
            });
        }
        self.consumed += weight;
        self.charges
            .insert(key.clone(), Charge { generation, weight });
        Ok(())
    }

    /// Returns `key`'s charge, only when `generation` still owns it. True when credited.
    pub fn credit(&mut self, key: &SessionKey, generation: u64) -> bool {
        match self.charges.get(key) {
            Some(c) if c.generation == generation => {
                self.consumed = self.consumed.saturating_sub(c.weight);
                self.charges.remove(key);
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sessionstore::SessionId;

    fn key(t: &str, s: &str) -> SessionKey {
        SessionKey {
            tenant: TenantId::new(t).unwrap(),
            session: SessionId::new(s).unwrap(),
        }
    }

    #[test]
    fn capacity_is_charged_and_credited_by_weight() {
        let mut a = Admission::new(3, IsolationClass::Shared);
        a.set_accepting(true);
        a.admit(&key("t", "a"), 1, 2).unwrap();
        assert!(matches!(
            a.admit(&key("t", "b"), 2, 2),
            Err(HostError::NoCapacity { needed: 2, free: 1 })
        ));
        assert!(a.credit(&key("t", "a"), 1));
        a.admit(&key("t", "b"), 2, 2).unwrap();
        assert_eq!(a.consumed(), 2);
    }

    #[test]
    fn a_late_credit_of_an_old_generation_does_not_uncharge_a_successor() {
        let mut a = Admission::new(2, IsolationClass::Shared);
        a.set_accepting(true);
        a.admit(&key("t", "a"), 1, 1).unwrap();
        a.admit(&key("t", "a"), 2, 1).unwrap(); // the successor attach claims the charge
        assert!(!a.credit(&key("t", "a"), 1));
        assert_eq!(a.consumed(), 1);
        assert!(a.credit(&key("t", "a"), 2));
        assert_eq!(a.consumed(), 0);
    }

    #[test]
    fn a_host_not_accepting_admits_nothing() {
        let mut a = Admission::new(2, IsolationClass::Shared);
        assert!(matches!(
            a.admit(&key("t", "a"), 1, 1),
            Err(HostError::NotAdmitting(_))
        ));
    }

    #[test]
    fn a_tenant_exclusive_host_refuses_a_second_tenant() {
        let mut a = Admission::new(4, IsolationClass::TenantExclusive);
        a.set_accepting(true);
        a.admit(&key("t1", "a"), 1, 1).unwrap();
        a.admit(&key("t1", "b"), 2, 1).unwrap();
        assert!(matches!(
            a.admit(&key("t2", "c"), 3, 1),
            Err(HostError::NotAdmitting(_))
        ));
    }
}
