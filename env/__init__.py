"""The core: value types, the Node and Controller protocols, the control loop, guards, metrics,
the Gymnasium envs and the simulator (`env.sim`); it imports nothing above it (DESIGN §2)."""
