package inspect

// InstanceState says whether instance i of s runs, reaches Kafka and
// watches the table, in the words `relay status` prints: "live, awake",
// "live, asleep (…)", "running, connecting to Kafka", "running, Kafka
// unreachable since …" or "expired". The console shows the same words.
func (s *Snapshot) InstanceState(i Instance) string { return instanceState(s, i) }
