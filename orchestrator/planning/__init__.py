"""Pure: task slots, ports and TF_CONFIG (the plan), each task's spec, GPUs, the port grid."""
