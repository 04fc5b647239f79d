"""Fleet simulator: replays the runtime's own schedules under preemption traces at scale."""
