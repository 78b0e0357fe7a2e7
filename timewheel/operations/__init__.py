"""The service layer: what the API's operations do, between the HTTP handlers and the store.

Where things live:

    api/          HTTP only: parse the request (timewheel/models), call an operation, shape the
                  answer (api/views.py); api/errors.py maps the domain errors to status codes
    operations/   the operations themselves, no HTTP: the checks that depend on settings,
                  a validated request turned into the record to store (prepare.py), the store
                  calls and what their replies mean (tasks.py, schedules.py, flows.py, ...);
                  records.py names the domain records the handlers show
    store/        Redis only, speaking domain records (store/record.py) and named replies
    engine/       claiming, timing and delivering attempts; schedules' occurrences
    service.py    ``Wheel``: builds one process's parts from Settings, starts and stops them
                  (the operations included: ``wheel.tasks``, ``wheel.flows``, ...)
"""
