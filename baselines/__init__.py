"""The hand-written controllers every learned one is compared with: PARTIES, Heracles, CoCo,
Intel PRM and Q-PRM, the oracle, and the unmanaged and static reference points."""
