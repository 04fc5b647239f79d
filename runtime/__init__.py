"""spotpipe training runtime: models, layouts, schedules, executor, strategies and failure handling."""
