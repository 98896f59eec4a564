"""The rule `Auto` decides by, pure functions of what it observes:

- `_records`: `Estimate` and `Decision`, what a decision estimated and chose;
- `_observation`: `Observation`, what `Auto` knows about an operator and its
    program;
- `_cost`: the cost of one `mv`, from its jaxpr or XLA's cost analysis;
- `_model`: `CostModel`, the machine constants;
- `_calibration`: this machine's constants, measured once and cached;
- `_formulas`: each policy's estimate of compile time, run time and memory, by
    policy class (`ESTIMATES`);
- `_rule`: the decision rule, `decide(observation) -> Decision`;
- `_unseen`: the decision for a call site of a program that is not read."""
