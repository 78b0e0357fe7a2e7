"""The service layer, between the HTTP handlers and the store: what is done with a validated
request (timewheel/models) before the store sees it, so the store speaks domain records only.

    prepare.py    a validated request (or a schedule's task template) as the record to store
    schedules.py  a schedule's PUT body as its stored spec; the ScheduleStore's templates

``timewheel/service.py`` is another thing: ``Wheel``, which builds one process's parts from
Settings and starts and stops them.
"""
