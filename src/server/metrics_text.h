// Prometheus text exposition (format 0.0.4) of the scheduler's ServiceStats. Pure function; thread-safe.
#pragma once

#include <string>

#include "scheduler/engine_service.h"
#include "server/image_queue.h"
#include "server/image_service.h"

namespace kestrel::server {

std::string prometheus_text(const ServiceStats& s, bool ready);
// kestrel_images_* / kestrel_image_*: the image path (server/image_service.h) and its worker pool
// (server/image_queue.h).
std::string prometheus_image_text(const ImageMetrics& m, const ImageQueueMetrics& q);

}  // namespace kestrel::server
